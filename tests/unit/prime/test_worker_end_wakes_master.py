"""A DLU actor that ends wakes the PrimeMaster, so the job's end (or a failure) is seen at once."""

from __future__ import annotations

import pytest

from dlu_api.vocabulary import ActorStage
from dlu_prime.worker.actor import WorkerActor


@pytest.fixture
def woken(monkeypatch: pytest.MonkeyPatch) -> tuple[WorkerActor, list[ActorStage]]:
    actor = WorkerActor.__new__(WorkerActor)  # no Ray: only the stage matters here
    seen: list[ActorStage] = []
    monkeypatch.setattr(actor, "_wake_master", lambda: seen.append(actor.stage))
    return actor, seen


@pytest.mark.parametrize("end", [ActorStage.FINISH, ActorStage.FAILED])
def test_the_end_wakes_the_prime_master_once(
    woken: tuple[WorkerActor, list[ActorStage]], end: ActorStage
) -> None:
    actor, seen = woken
    for stage in (ActorStage.INIT, ActorStage.READY, ActorStage.RUNNING, end, end):
        actor.stage = stage
    assert seen == [end]
    assert actor.stage is end


def test_without_ray_waking_does_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    import ray

    monkeypatch.setattr(ray, "is_initialized", lambda: False)  # other tests may have a Ray up
    actor = WorkerActor.__new__(WorkerActor)
    actor.stage = ActorStage.FINISH  # no Ray: no call, no error
    assert actor.stage is ActorStage.FINISH
