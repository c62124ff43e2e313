"""`role_finished`: what a SubMaster set up again asks the PrimeMaster, so that a replacement for
a role whose workers all finished leaves them finished instead of starting training anew."""

from __future__ import annotations

import pytest
from conftest import build_spec, role

from dlu_api.vocabulary import ActorStage
from dlu_prime.master.lifecycle import new_state
from dlu_prime.master.state import SUB_MASTER_RANK, ActorRecord, JobState, role_finished

pytestmark = pytest.mark.timeout(30)


def state_with(*stages: ActorStage, sub_master: ActorStage | None = None) -> JobState:
    state = new_state(build_spec([role("trainer", 1), role("workers", len(stages), is_driver=False)]))
    for record, stage in zip(
        sorted((a for a in state.actors.values() if a.role == "workers"), key=lambda a: a.rank),
        stages,
        strict=True,
    ):
        record.stage = stage
    if sub_master is not None:
        name = "job.workers.submaster"
        state.actors[name] = ActorRecord(name=name, role="workers", rank=SUB_MASTER_RANK, stage=sub_master)
    return state


@pytest.mark.parametrize(
    ("stages", "finished"),
    [
        ((ActorStage.FINISH, ActorStage.FINISH), True),
        ((ActorStage.FINISH, ActorStage.RUNNING), False),  # a peer trains on: a new master reruns both
        ((ActorStage.READY, ActorStage.READY), False),  # the first set-up
        ((ActorStage.FINISH, ActorStage.FAILED), False),
    ],
)
def test_a_role_is_finished_when_every_worker_finished(
    stages: tuple[ActorStage, ...], finished: bool
) -> None:
    assert role_finished(state_with(*stages), "workers") is finished


def test_the_sub_master_itself_is_not_a_worker_and_an_unknown_role_never_finished() -> None:
    state = state_with(ActorStage.FINISH, ActorStage.FINISH, sub_master=ActorStage.FAILED)
    assert role_finished(state, "workers")
    assert not role_finished(state, "nope")
