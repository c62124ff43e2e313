"""The resize decisions in the core on their own: a `dlu scale` request, an elastic resize's
steps (each decided from the outcome of the one before), a SubMaster away, and the executor's
wait for a rebuilt actor on the clock port (no scheduler decides anything here)."""

from __future__ import annotations

from typing import Any, cast

import pytest
from conftest import FakeClock, RecordingStore
from test_elastic_resizer import T, running

from dlu_api.vocabulary import EventKind
from dlu_prime.master.changes import ActorsPlaced, Note
from dlu_prime.master.core import Decision, decide
from dlu_prime.master.core.commands import (
    AddActors,
    CheckNodes,
    FindPlacedNodes,
    Purpose,
    ReformTraining,
    RemoveActors,
    RunChecks,
    Wake,
)
from dlu_prime.master.core.events import Done, Event, ResizeDue, ScaleRequested
from dlu_prime.master.executor import Callbacks, Executor
from dlu_prime.master.resize import ResizeBegan, ResizeChecked, ResizeEnded
from dlu_prime.master.resize_plan import ResizePlan, ScaleError, SubMasterAway
from dlu_prime.master.state import JobState
from dlu_prime.scheduler.base import ActorObservation, ActorSetupError, Scheduler
from dlu_prime.testing.sim.clock import SimClock

pytestmark = pytest.mark.timeout(30)

NOW = 5_000.0


def _pure(state: JobState, event: Event) -> Decision:
    before = state.dumps()
    decision = decide(state, event, NOW)
    assert state.dumps() == before, "decide changed the state"
    return decision


def test_a_scale_request_is_decided_at_once_and_refused_naming_the_range() -> None:
    manager, _ = running(RecordingStore(), FakeClock(), {0})
    decision = _pure(manager.state, ScaleRequested("trainer", 2, request_id="r-1"))
    assert [type(c) for c in decision.changes] == [ResizeBegan] and decision.commands == (Wake(),)
    plan = decision.reply
    assert isinstance(plan, ResizePlan) and (plan.nodes, plan.added) == (2, ((T(1), 1),))
    refused = _pure(manager.state, ScaleRequested("trainer", 5))
    assert isinstance(refused.error, ScaleError) and "outside its nnodes 1:2" in str(refused.error)
    assert not refused.changes and not refused.commands


def test_an_elastic_growth_is_a_chain_of_steps_decided_from_each_outcome() -> None:
    manager, _ = running(RecordingStore(), FakeClock(), {0})
    manager.handle(ScaleRequested("trainer", 2))
    state = manager.state
    (placed,) = _pure(state, ResizeDue()).commands
    assert isinstance(placed, FindPlacedNodes) and (placed.nodes, placed.purpose) == ((1,), Purpose.RESIZE)
    (add,) = _pure(state, Done(placed, [1])).commands
    assert isinstance(add, AddActors) and add.ranks == (1,)
    added = _pure(state, Done(add, {T(1): "node-new"}))
    assert [type(c) for c in added.changes] == [ActorsPlaced]
    (check,) = added.commands
    assert isinstance(check, CheckNodes) and check.ranks == (1,)
    checked = _pure(state, Done(check))
    assert checked.changes == (ResizeChecked((1,)),)
    (reform,) = checked.commands
    assert isinstance(reform, ReformTraining) and (reform.ranks, reform.added) == ((0, 1), (1,))
    not_formed = _pure(state, Done(reform, None))  # the round at the new world never completed
    (undo,) = not_formed.commands
    assert isinstance(undo, RemoveActors) and undo.names == (T(1),) and "did not re-form" in (undo.undo or "")
    ended = _pure(state, Done(undo))
    assert [type(c) for c in ended.changes] == [ResizeEnded]
    assert ended.changes[0] == ResizeEnded(undo.undo)


def test_a_sub_master_away_keeps_the_resize_in_flight_and_is_said_once() -> None:
    manager, _ = running(RecordingStore(), FakeClock(), {0})
    manager.handle(ScaleRequested("trainer", 2))
    check = CheckNodes("job.trainer.submaster", (1,), 60.0)
    away = Done(check, None, SubMasterAway("its SubMaster is being rebuilt by Ray"))
    waits = _pure(manager.state, away)
    (note,) = waits.changes
    assert isinstance(note, Note) and note.kind is EventKind.RESIZE_WAITING and not waits.commands
    manager.apply(*waits.changes)
    again = _pure(manager.state, away)
    assert (again.changes, again.commands, again.error) == ((), (), None)
    assert manager.state.resize is not None


class _Rebuilding:
    """A scheduler whose actor died under its checks and that Ray never brings back."""

    def __init__(self) -> None:
        self.polls = 0

    def setup(self, names: list[str]) -> None:
        raise ActorSetupError(names[0], "died under its check", transient=True)

    def poll(self, names: list[str]) -> dict[str, ActorObservation]:
        self.polls += 1
        return {names[0]: ActorObservation.restarting("Ray is restarting it")}


def test_the_wait_for_a_rebuilt_actor_is_governed_by_the_clock_port() -> None:
    clock = SimClock()
    scheduler = _Rebuilding()
    callbacks = Callbacks(lambda: None, lambda reason, failed: None, lambda: None, lambda: [])
    executor = Executor(cast(Scheduler, cast(Any, scheduler)), callbacks, clock=clock, sleep=clock.sleep)
    started = clock()
    done = executor.run(RunChecks((T(0),), Purpose.PREPARE, wait_s=30.0))
    assert isinstance(done.error, ActorSetupError) and done.value is None
    assert 30.0 <= clock() - started <= 30.2  # simulated seconds, slept on the port
    assert 300 <= scheduler.polls <= 302  # one poll per 0.1 s of the wait, none after it
