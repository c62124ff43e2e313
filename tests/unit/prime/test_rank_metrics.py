"""The last metric a rank reports with `heartbeat(step, metric)` reaches the job's status, and
stays once the rank finished (its final loss, say)."""

from __future__ import annotations

from typing import Any

import pytest

from dlu_api.vocabulary import ActorStage
from dlu_prime.master.liveness import Liveness
from dlu_prime.scheduler.base import ActorObservation

pytestmark = pytest.mark.timeout(30)


def answer(**fields: Any) -> dict[str, Any]:
    return {"stage": "RUNNING", "step": 3, **fields}


def test_a_polled_metric_is_read_as_a_number_or_not_at_all() -> None:
    assert ActorObservation.from_status(answer(metric=2.5)).metric == 2.5
    assert ActorObservation.from_status(answer(metric=3)).metric == 3.0
    for odd in (None, "2.5", True, [1.0]):
        assert ActorObservation.from_status(answer(metric=odd)).metric is None
    assert ActorObservation.from_status(answer()).metric is None


def test_the_last_metric_outlives_the_rank_and_a_job_restart_forgets_it() -> None:
    liveness = Liveness()
    liveness.track({"a": ActorObservation(stage=ActorStage.RUNNING, step=5, metric=3.0)}, now=1.0)
    liveness.track({"a": ActorObservation(stage=ActorStage.RUNNING, step=6)}, now=2.0)  # no metric this beat
    assert liveness.last_metrics() == {"a": 3.0}
    liveness.track({"a": ActorObservation(stage=ActorStage.RUNNING, step=9, metric=1.25)}, now=3.0)
    liveness.track({"a": ActorObservation(stage=ActorStage.FINISH, step=0)}, now=4.0)
    assert liveness.last_metrics() == {"a": 1.25}
    liveness.forget()
    assert liveness.last_metrics() == {}


def test_the_status_carries_each_actors_metric(make_manager: Any) -> None:
    manager, _ = make_manager()
    names = sorted(manager.state.actors)
    manager.liveness.track(
        {names[0]: ActorObservation(stage=ActorStage.RUNNING, step=4, metric=0.5)}, now=1.0
    )
    metrics = {a.name: a.metric for role in manager.status().roles for a in role.actors}
    assert metrics[names[0]] == 0.5
    assert all(metrics[name] is None for name in names[1:])


def test_the_console_knows_a_sub_masters_rank() -> None:
    """dlu-api cannot import dlu_prime: the console's copy of the SubMaster's rank must agree."""
    from dlu_api.cli import console_model
    from dlu_prime.master import state

    assert console_model.SUB_MASTER_RANK == state.SUB_MASTER_RANK
