"""The steps the auto-scaling feed measures: an elastic rank's, relayed by its agent."""

from __future__ import annotations

import pytest

from dlu_api.spec import spec_from_dict
from dlu_api.status import JobStage
from dlu_api.vocabulary import ActorStage
from dlu_prime.autoscale.feed import JobStatistics
from dlu_prime.master.manager import new_state
from dlu_prime.master.state import SUB_MASTER_RANK
from dlu_prime.scheduler.base import ActorObservation

pytestmark = pytest.mark.timeout(30)


def test_an_elastic_ranks_relayed_steps_are_measured_and_a_worker_without_steps_is_not() -> None:
    """Issue 30: on Ray an elastic rank's agent relays its training process's beats (its status
    says steps_reported False, as the ElasticMaster judges hangs), and the feed skipped every such
    rank: an elastic role was never measured, so single-job auto-scaling never decided on Ray."""
    spec = spec_from_dict(
        {
            "name": "lm",
            "roles": [
                {
                    "name": "train",
                    "kind": "elastic",
                    "entrypoint": "m:f",
                    "elastic": {"nnodes": "1:2"},
                }
            ],
            "autoscale": {"mode": "single-job", "settle_s": 0, "measure_s": 1},
        }
    )
    state = new_state(spec)
    for record in state.actors.values():
        record.stage = ActorStage.RUNNING
    state.stage = JobStage.RUNNING
    ranks = [n for n, a in state.actors.items() if a.rank != SUB_MASTER_RANK]
    stats = JobStatistics(0.0)
    for t in range(1, 6):
        relayed = ActorObservation.from_status(
            {"stage": "RUNNING", "step": 2 * t, "steps_reported": False, "beats": t, "pid": 7}
        )
        stats.observe(state, dict.fromkeys(ranks, relayed), float(t))
    assert stats.meter.by_size("train") == {2: pytest.approx(2.0)}
    idle = JobStatistics(0.0)
    for t in range(1, 6):  # a worker that never reported a step: nothing to measure
        idle.observe(state, dict.fromkeys(ranks, ActorObservation(ActorStage.RUNNING)), float(t))
    assert idle.meter.by_size("train") == {}
