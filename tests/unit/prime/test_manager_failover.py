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
    # (steps count every poll so far) the next poll is the rebuilt PrimeMaster's look at the
    # saved failover's actor (E1, failed, not a death: its work), then the SubMaster's, asked
    # whether it is the set-up incarnation before it fails over; the one after, the first
    # pass, sees the end
    sched.script(*([{}] * (sched.polls + 2)), {"train": ActorStage.FINISH})
    again.run()
    state = again.state
    assert state.exit_code == EXIT_OK and state.failover is None
    assert state.roles["train"].restart_count == 1 and state.actors[E1].restart_count == 1
    assert [e.kind for e in state.events if e.kind.startswith("failover_")] == [
        "failover_started",
        "failover_done",
    ]
    assert "role failover in flight" in next(e.message for e in state.events if e.kind == "master_restarted")


T0, T1 = "job.trainer.0", "job.trainer.1"


def _killed_after_placing_t1(make_manager: ManagerFactory, store: RecordingStore) -> FakeScheduler:
    """T1 failed; its role failover saved and its replacement placed (saved READY), then the
    PrimeMaster is killed before starting it."""
    manager, sched = make_manager(
        roles=[{"name": "trainer", "entrypoint": "pkg.t:main", "total": 2, "recovery": "in_place"}]
    )
    manager.prepare()
    manager.start()
    for name in sched.actors:
        sched.actors[name].stage = ActorStage.RUNNING

    def die(_: FakeScheduler) -> None:
        raise SystemExit("PrimeMaster killed")

    sched.on("start", die)
    sched.set(T1, {"stage": ActorStage.FAILED, "error": "boom"})
    with pytest.raises(SystemExit):
        manager.monitor_once()
    sched.hooks.clear()
    stored = store.state("job")
    assert stored is not None and stored.failover is not None
    assert stored.actors[T1].stage is ActorStage.READY  # placed, not started
    return sched


def test_a_placed_replacement_dead_before_the_rebuilt_one_resumes_is_a_new_fault(
    make_manager: ManagerFactory, store: RecordingStore
) -> None:
    """Seed 8553: the replacement's node is lost between the PrimeMaster's death and the rebuilt
    one's resume. The resumed failover replaces it anyway, but that death is a new fault: its
    event, its count on its culprit and its new node; the healthy T0 is never touched."""
    sched = _killed_after_placing_t1(make_manager, store)
    sched.set(T1, {"stage": None, "error": "node lost"})
    again = reconstruct(sched.manager, sched, store)  # type: ignore[arg-type]
    before = len(sched.calls)
    again.resume_in_flight()
    state = again.state
    assert state.failover is None and state.stage is JobStage.RUNNING
    assert [e.kind for e in state.events if e.kind.startswith("failover_")] == [
        "failover_started",
        "failover_started",
        "failover_done",
    ]
    second = [e for e in state.events if e.kind == "failover_started"][1]
    assert second.actor == T1 and "node lost" in second.message
    assert [e.message for e in state.events if e.kind == "died"] == ["node lost"]
    assert state.roles["trainer"].restart_count == 2 and state.actors[T1].restart_count == 2
    assert state.node_failures.get(f"node-after-restart-{T1}") == 1
    assert [c.names for c in sched.calls_to("restart")] == [(T1,), (T1,)]
    assert all(T0 not in c.names for c in sched.calls[before:] if c.method != "poll")
    assert sched.actors[T1].stage is ActorStage.RUNNING


def test_a_placed_replacement_alive_is_resumed_without_a_new_count(
    make_manager: ManagerFactory, store: RecordingStore
) -> None:
    sched = _killed_after_placing_t1(make_manager, store)
    again = reconstruct(sched.manager, sched, store)  # type: ignore[arg-type]
    again.resume_in_flight()
    state = again.state
    assert state.failover is None and state.roles["trainer"].restart_count == 1
    assert [e.kind for e in state.events if e.kind.startswith("failover_")] == [
        "failover_started",
        "failover_done",
    ]
    assert sched.actors[T1].stage is ActorStage.RUNNING


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
