"""PrimeMaster failover (tier 6), the seed's `test_manager_failover`: a new PrimeManager loads the
saved state. READY (short-lived) stops safely; RUNNING resumes monitoring with zero worker
restarts; a PrimeMaster lost during a role failover finishes it, counted once."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest
from failover_helpers import elastic_role

from dlu_api.status import JobStage
from dlu_api.vocabulary import ActorStage, Tier
from dlu_prime.master.manager import EXIT_FAILED, EXIT_OK, PrimeManager

if TYPE_CHECKING:
    from conftest import FakeScheduler, ManagerFactory, RecordingStore

E1 = "job.train.1"


def reconstruct(manager: PrimeManager, sched: FakeScheduler, store: RecordingStore) -> PrimeManager:
    again = PrimeManager.self_recover(manager.state.spec, sched, store, clock=manager.clock)
    assert again is not None
    sched.manager = again
    return again


def test_killed_in_ready_stops_safely(make_manager: ManagerFactory, store: RecordingStore) -> None:
    manager, sched = make_manager(roles=[elastic_role()])
    manager.prepare()
    assert manager.state.stage is JobStage.READY
    again = reconstruct(manager, sched, store)
    assert again.state.stage is JobStage.STOPPED and again.state.exit_code == EXIT_FAILED
    assert "restarted during READY, a short-lived stage" in again.state.reason
    assert again.state.master_restart_count == 1 and sched.cleaned_up


def test_killed_in_running_resumes_with_zero_worker_restarts(
    make_manager: ManagerFactory, store: RecordingStore
) -> None:
    manager, sched = make_manager(roles=[elastic_role()])
    manager.prepare()
    manager.start()
    for name in sched.actors:
        sched.actors[name].stage = ActorStage.RUNNING
    manager.monitor_once()  # the saved state now says RUNNING for every actor
    starts = len(sched.calls_to("start"))
    again = reconstruct(manager, sched, store)
    assert again.state.stage is JobStage.RUNNING and again.state.master_restart_count == 1
    sched.script({}, {"train": ActorStage.FINISH})
    again.run()
    assert again.state.exit_code == EXIT_OK
    assert not sched.calls_to("restart") and len(sched.calls_to("start")) == starts
    assert sum(a.restart_count for a in again.state.actors.values()) == 0
    events = [e for e in again.state.events if e.kind == "master_restarted"]
    assert len(events) == 1 and events[0].tier == Tier.MASTER


def test_killed_during_a_role_failover_finishes_it_counted_once(
    make_manager: ManagerFactory, store: RecordingStore
) -> None:
    manager, sched = make_manager(roles=[elastic_role()])
    manager.prepare()
    manager.start()
    for name in sched.actors:
        sched.actors[name].stage = ActorStage.RUNNING

    def die(_: FakeScheduler) -> None:
        raise SystemExit("PrimeMaster killed")

    sched.on("call", die)
    sched.set(E1, {"stage": ActorStage.FAILED, "error": "boom"})
    with pytest.raises(SystemExit):
        manager.monitor_once()
    sched.hooks.clear()

    again = reconstruct(manager, sched, store)
    assert again.state.failover is not None  # still in flight: run() finishes it first
    # (steps count every poll so far) the next poll is the SubMaster's, asked whether it is the
    # set-up incarnation before it fails over; the one after, the first pass, sees the end
    sched.script(*([{}] * (sched.polls + 1)), {"train": ActorStage.FINISH})
    again.run()
    state = again.state
    assert state.exit_code == EXIT_OK and state.failover is None
    assert state.roles["train"].restart_count == 1 and state.actors[E1].restart_count == 1
    assert [e.kind for e in state.events if e.kind.startswith("failover_")] == [
        "failover_started",
        "failover_done",
    ]
    assert "role failover in flight" in next(e.message for e in state.events if e.kind == "master_restarted")


def test_self_recovery_with_nothing_stored_returns_none(
    make_manager: ManagerFactory, store: RecordingStore
) -> None:
    manager, sched = make_manager()
    store.delete("job")
    assert PrimeManager.self_recover(manager.state.spec, sched, store) is None


def test_past_master_max_restart_the_job_stops_naming_the_limit(
    make_manager: ManagerFactory, store: RecordingStore
) -> None:
    manager, sched = make_manager(roles=[elastic_role()], limits={"master_max_restart": 1})
    manager.prepare()
    manager.start()
    again = reconstruct(manager, sched, store)
    assert again.state.stage is JobStage.RUNNING
    third = reconstruct(again, sched, store)
    assert third.state.exit_code == EXIT_FAILED
    assert third.state.reason == "master_max_restart=1 reached (2 PrimeMaster restarts)"
