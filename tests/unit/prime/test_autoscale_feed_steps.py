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


def test_a_world_whose_first_steps_come_late_is_measured_for_measure_s_before_a_decision() -> None:
    """Issue 30, seen on Ray under load: the ranks' processes were still starting (torch
    imported, rendezvous) when `settle_s + measure_s` had passed since the job started; the
    policy judged the size on one interval and read '2 nodes 0.0 steps/s', then shrank the role.
    The time a world counts as measured starts at its first measured step."""
    from dlu_prime.autoscale.policy import RoleView
    from dlu_prime.master.core import autoscale_pass
    from dlu_prime.master.core.events import AutoscaleObserved

    spec = spec_from_dict(
        {
            "name": "lm",
            "roles": [
                {
                    "name": "train",
                    "kind": "elastic",
                    "entrypoint": "m:f",
                    "resizable": True,
                    "elastic": {"nnodes": "1:2"},
                }
            ],
            "autoscale": {"mode": "single-job", "settle_s": 2, "measure_s": 6},
        }
    )
    state = new_state(spec)
    for record in state.actors.values():
        record.stage = ActorStage.RUNNING
    state.stage = JobStage.RUNNING
    ranks = [n for n, a in state.actors.items() if a.rank != SUB_MASTER_RANK]
    stats = JobStatistics(0.0)

    def at(t: float, step: int) -> list[RoleView]:
        seen = ActorObservation.from_status(
            {"stage": "RUNNING", "step": step, "steps_reported": False, "pid": 7}
        )
        stats.observe(state, dict.fromkeys(ranks, seen), t)
        return stats.views(state, t)

    def decided(views: list[RoleView], t: float) -> bool:
        return bool(
            autoscale_pass.observed(state, AutoscaleObserved(tuple(views), stats.quiet_for(t)), t).changes
        )

    t = 0.0
    while t < 12.0:  # starting: no step yet, long past settle_s + measure_s
        t += 0.5
        assert not decided(at(t, 0), t)
    views = at(12.5, 1)  # the first step: nothing measured yet
    views = at(13.0, 2)  # one interval
    (view,) = views
    assert view.measured_s == pytest.approx(0.0) and not decided(views, 13.0)
    step = 2
    while t < 18.5:
        t = round(t + 0.5, 1) if t >= 13.0 else 13.5
        step += 1
        views = at(t, step)
        assert not decided(views, t), (t, views)
    t, step = 19.0, step + 1
    views = at(t, step)
    (view,) = views
    assert view.measured_s >= 6 and view.by_size[2] == pytest.approx(2.0)
    assert decided(views, t)  # measured for measure_s at 2 steps/s: 2 -> 1 to measure 1 node
