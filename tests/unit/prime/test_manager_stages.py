"""PrimeManager stage machine with a fake scheduler, a fake clock and the in-memory store: no Ray.

Covers the happy path, every way a job ends, stop requests, fencing, resubmission, illegal
transitions, and the state document itself (round trip, schema version, bounds, size).
"""

from __future__ import annotations

import json
import threading
import time
from typing import TYPE_CHECKING

import pytest

from dlu_api.status import JobStage
from dlu_api.vocabulary import ActorStage
from dlu_prime.master.manager import (
    ALLOWED,
    EXIT_FAILED,
    EXIT_OK,
    EXIT_STOPPED,
    FencedError,
    IllegalTransition,
    PrimeManager,
    new_state,
)
from dlu_prime.master.state import MAX_EVENTS, SCHEMA_VERSION, JobState
from dlu_prime.naming import sub_master_name
from dlu_prime.scheduler.base import ActorSetupError, SchedulingError
from dlu_prime.state.base import StateConflictError

if TYPE_CHECKING:
    from conftest import (
        FakeClock,
        FakeScheduler,
        ManagerFactory,
        RecordingStore,
        RoleFactory,
        SchedulerFactory,
        SpecFactory,
    )

JOB = "job"
T0, T1 = "job.trainer.0", "job.trainer.1"

TRACEBACK = (
    "Traceback (most recent call last):\n"
    '  File "/app/train.py", line 12, in main\n'
    "    loss = step(batch)\n"
    "ValueError: loss is NaN at step 42\n"
)


def stage_messages(state: JobState) -> list[str]:
    return [e.message for e in state.events if e.kind == "stage"]


def transitions(state: JobState) -> list[str]:
    """'A -> B' of every stage event, without the reasons."""
    return [m.split(":", 1)[0] for m in stage_messages(state)]


def kinds(state: JobState) -> list[str]:
    return [e.kind for e in state.events]


def distinct(values: list[JobStage]) -> list[JobStage]:
    out: list[JobStage] = []
    for value in values:
        if not out or out[-1] is not value:
            out.append(value)
    return out


def assert_stored_matches(store: RecordingStore, manager: PrimeManager) -> None:
    stored = store.state(JOB)
    assert stored is not None
    assert stored == manager.state
    assert store.token(JOB) == manager.token


def assert_failed_and_cleaned(manager: PrimeManager, sched: FakeScheduler, store: RecordingStore) -> str:
    """The job stopped with exit 1, cleanup ran with STOPPING saved; returns the reason."""
    assert manager.state.stage is JobStage.STOPPED
    assert manager.state.exit_code == EXIT_FAILED
    assert sched.only_call("cleanup").stored_stage is JobStage.STOPPING
    assert sched.methods()[-2:] == ["stop", "cleanup"]
    assert transitions(manager.state)[-2:] == ["RUNNING -> STOPPING", "STOPPING -> STOPPED"]
    assert_stored_matches(store, manager)
    return manager.state.reason


# happy path ------------------------------------------------------------------------------------
def test_happy_path_goes_through_every_stage(
    make_manager: ManagerFactory, store: RecordingStore, fake_clock: FakeClock
) -> None:
    manager, sched = make_manager()
    sched.tick = 5.0
    sched.script({}, {"trainer": ActorStage.FINISH})
    manager.run()

    state = manager.state
    assert state.stage is JobStage.STOPPED
    assert state.exit_code == EXIT_OK
    assert state.reason == "every driver role finished (trainer)"
    assert {a.stage for a in state.actors.values()} == {ActorStage.FINISH}
    assert sched.methods() == [
        "prepare",
        "setup",
        "check_children",
        "start",
        "poll",
        "poll",
        "stop",
        "cleanup",
    ]
    assert sched.only_call("start").names == (T0, T1)
    # finished actors are stopped too before the clean-up: an elastic agent that finished
    # still holds checkpoint slots that only its stop removes at once
    assert sched.only_call("stop").names == (T0, T1)
    assert sched.polls == 2
    assert fake_clock() == 1_010.0

    # One "stage" event per transition, in order, stamped by the fake clock.
    assert transitions(state) == [
        "INIT -> READY",
        "READY -> RUNNING",
        "RUNNING -> STOPPING",
        "STOPPING -> STOPPED",
    ]
    assert stage_messages(state)[2] == "RUNNING -> STOPPING: every driver role finished (trainer)"
    times = [e.time for e in state.events]
    assert times == sorted(times)
    assert times[0] == 1_000.0 and times[-1] == 1_010.0
    assert kinds(state) == [
        "job_created",
        "actors_created",
        "stage",
        "stage",
        "role_finished",
        "stage",
        "stage",
    ]
    assert state.updated_at == 1_010.0
    assert_stored_matches(store, manager)


def test_every_transition_is_saved_with_increasing_tokens(
    make_manager: ManagerFactory, store: RecordingStore
) -> None:
    manager, sched = make_manager()
    sched.script({}, {"trainer": ActorStage.FINISH})
    manager.run()

    tokens = [p.token for p in store.puts]
    assert tokens == list(range(1, len(tokens) + 1))
    assert all(p.run_id == manager.state.run_id for p in store.puts)
    assert distinct([p.stage for p in store.puts]) == [
        JobStage.INIT,
        JobStage.READY,
        JobStage.RUNNING,
        JobStage.STOPPING,
        JobStage.STOPPED,
    ]
    # A put for every transition: the number of puts whose stage differs from the previous one.
    changes = sum(1 for a, b in zip(store.puts, store.puts[1:], strict=False) if a.stage is not b.stage)
    assert changes == len(stage_messages(manager.state)) == 4
    assert_stored_matches(store, manager)


def test_every_decision_is_saved_before_the_scheduler_acts(make_manager: ManagerFactory) -> None:
    manager, sched = make_manager()
    sched.script({}, {"trainer": ActorStage.FINISH})
    manager.run()

    prepare = sched.only_call("prepare")
    assert prepare.stored_stage is JobStage.INIT and prepare.token == 1  # the created run is stored
    setup = sched.only_call("setup")
    assert setup.stored_stage is JobStage.INIT
    assert setup.stored is not None
    assert {n: a.node_id for n, a in setup.stored.actors.items()} == {T0: "node-0", T1: "node-1"}
    start = sched.only_call("start")
    assert start.stored_stage is JobStage.RUNNING
    assert start.stored is not None
    assert {a.stage for a in start.stored.actors.values()} == {ActorStage.READY}
    first_poll, second_poll = sched.calls_to("poll")
    assert first_poll.stored_stage is second_poll.stored_stage is JobStage.RUNNING
    assert second_poll.stored is not None
    assert {a.stage for a in second_poll.stored.actors.values()} == {ActorStage.RUNNING}
    stop, cleanup = sched.only_call("stop"), sched.only_call("cleanup")
    assert stop.stored_stage is cleanup.stored_stage is JobStage.STOPPING
    assert cleanup.stored is not None and cleanup.stored.exit_code == EXIT_OK
    tokens = [c.token or 0 for c in sched.calls]
    assert tokens == sorted(tokens) and tokens[0] >= 1  # the store only moved forward


# driver and non-driver roles -------------------------------------------------------------------
def test_job_ends_when_drivers_finish_and_stops_non_drivers(
    make_manager: ManagerFactory, make_role: RoleFactory, store: RecordingStore
) -> None:
    manager, sched = make_manager(roles=[make_role("trainer", 1), make_role("server", 2, is_driver=False)])
    servers = sched.names_of("server")
    sched.script({}, {"trainer": ActorStage.FINISH})
    manager.run()

    state = manager.state
    assert state.stage is JobStage.STOPPED and state.exit_code == EXIT_OK
    assert state.reason == "every driver role finished (trainer)"
    assert "server" not in state.reason
    stop = sched.only_call("stop")
    assert servers == ["job.server.0", "job.server.1"]
    assert list(stop.names) == ["job.trainer.0", *servers]  # the finished trainer too
    assert stop.stored_stage is JobStage.STOPPING
    assert sched.methods()[-2:] == ["stop", "cleanup"]
    assert [e.role for e in state.events if e.kind == "role_finished"] == ["trainer"]
    # Stopped by the job's end: the final status lists none of them RUNNING.
    assert {state.actors[n].stage for n in servers} == {ActorStage.STOPPED}
    assert state.actors["job.trainer.0"].stage is ActorStage.FINISH
    assert_stored_matches(store, manager)


def test_job_waits_for_every_driver_role(make_manager: ManagerFactory, make_role: RoleFactory) -> None:
    manager, sched = make_manager(
        roles=[make_role("trainer", 2), make_role("evaluator", 1), make_role("server", 1, is_driver=False)]
    )
    sched.script({}, {"trainer": ActorStage.FINISH}, {}, {"evaluator": ActorStage.FINISH})
    manager.run()

    assert sched.polls == 4  # not done after the trainer alone
    assert manager.state.exit_code == EXIT_OK
    assert manager.state.reason == "every driver role finished (trainer, evaluator)"
    assert [e.role for e in manager.state.events if e.kind == "role_finished"] == ["trainer", "evaluator"]
    # the finished actors too (an agent that finished still holds its checkpoint slots)
    assert set(sched.only_call("stop").names) == {
        "job.trainer.0",
        "job.trainer.1",
        "job.evaluator.0",
        "job.server.0",
    }


def test_sub_master_role_is_started_through_its_sub_master(
    make_manager: ManagerFactory, make_role: RoleFactory
) -> None:
    """A custom role's SubMaster is checked and started; it starts its own workers, and the role
    is finished when its workers are (the SubMaster itself never finishes)."""
    rollout = make_role("rollout", 2, kind="custom", sub_master="pkg.rollout:RolloutMaster")
    manager, sched = make_manager(roles=[make_role("trainer", 1), rollout])
    sub = sub_master_name(JOB, "rollout")
    workers = sched.names_of("rollout")
    workers.remove(sub)
    assert sub in manager.state.actors and workers == ["job.rollout.0", "job.rollout.1"]

    def sub_master_starts_workers(s: FakeScheduler) -> None:
        s.set("job.rollout.0", ActorStage.RUNNING)
        s.set("job.rollout.1", ActorStage.RUNNING)

    sched.on("start", sub_master_starts_workers)
    sched.script(
        {},
        {"trainer": ActorStage.FINISH, "job.rollout.0": ActorStage.FINISH},
        {"job.rollout.1": ActorStage.FINISH},
    )
    manager.run()

    assert sched.only_call("check_children").names == (sub,)
    assert sched.only_call("start").names == ("job.trainer.0", sub)
    assert sched.polls == 3  # the rollout role finished only when its last worker did
    assert manager.state.exit_code == EXIT_OK
    assert manager.state.reason == "every driver role finished (trainer, rollout)"
    # the SubMaster, and the finished workers too (an agent that finished still holds slots)
    assert set(sched.only_call("stop").names) == {"job.trainer.0", "job.rollout.0", "job.rollout.1", sub}


# failures while running ------------------------------------------------------------------------
def test_failed_driver_actor_ends_the_job_with_its_traceback(
    make_manager: ManagerFactory, store: RecordingStore
) -> None:
    manager, sched = make_manager(
        limits={"global_restart_budget": 0}
    )  # no restart allowed: the failure ends the job
    sched.script({}, {T1: {"stage": ActorStage.FAILED, "error": TRACEBACK}})
    manager.run()

    reason = assert_failed_and_cleaned(manager, sched, store)
    assert (
        reason.splitlines()[0]
        == f"global_restart_budget=0 used up (0 job-level restarts); culprit: {T1} on node node-1 (failed): ValueError: loss is NaN at step 42"
    )
    assert TRACEBACK.strip() in reason
    assert sched.only_call("stop").names == (T0,)  # the failed one is not stopped again
    record = manager.state.actors[T1]
    assert record.stage is ActorStage.FAILED and record.error == TRACEBACK and record.total_failures == 1
    assert [e.actor for e in manager.state.events if e.kind == "failed"] == [T1]


def test_dead_actor_ends_the_job(make_manager: ManagerFactory, store: RecordingStore) -> None:
    manager, sched = make_manager(limits={"global_restart_budget": 0})
    sched.script({}, {T0: {"stage": None, "error": "actor job.trainer.0 died: its node was lost"}})
    manager.run()

    reason = assert_failed_and_cleaned(manager, sched, store)
    assert reason.startswith(
        f"global_restart_budget=0 used up (0 job-level restarts); culprit: {T0} on node node-0 (died): actor job.trainer.0 died: its node was lost"
    )
    assert manager.state.actors[T0].stage is ActorStage.FAILED
    assert sched.only_call("stop").names == (T1,)


def test_reported_error_ends_the_job(make_manager: ManagerFactory, store: RecordingStore) -> None:
    manager, sched = make_manager(limits={"global_restart_budget": 0})
    sched.script({}, {T0: {"reported_errors": ("RuntimeError: CUDA out of memory",)}})
    manager.run()

    reason = assert_failed_and_cleaned(manager, sched, store)
    assert reason.startswith(
        f"global_restart_budget=0 used up (0 job-level restarts); culprit: {T0} on node node-0 (error_report): RuntimeError: CUDA out of memory"
    )
    assert sched.only_call("stop").names == (T0, T1)  # it reported, it did not exit: stop it too


def test_stale_heartbeat_ends_the_job(
    make_manager: ManagerFactory, store: RecordingStore, fake_clock: FakeClock
) -> None:
    manager, sched = make_manager(health={"heartbeat_timeout_s": 60}, limits={"global_restart_budget": 0})
    one_beat = {"last_heartbeat": fake_clock(), "beats": 1, "watched": True}
    sched.on("start", lambda s: s.set("*", one_beat))  # one beat, then silence
    sched.tick = 30.0
    manager.run()

    # The PrimeMaster's own clock: the beat is first seen at the first poll (+30 s); 60 s after
    # it is within the timeout, 90 s is not.
    assert sched.polls == 4
    reason = assert_failed_and_cleaned(manager, sched, store)
    assert reason.startswith(
        f"global_restart_budget=0 used up (0 job-level restarts); culprit: {T0} on node node-0 (heartbeat_timeout): no heartbeat for 90s (timeout 60s)"
    )
    assert [e.kind for e in manager.state.events].count("heartbeat_timeout") == 2


def test_heartbeats_that_keep_coming_keep_the_job_running(
    make_manager: ManagerFactory, fake_clock: FakeClock
) -> None:
    manager, sched = make_manager(health={"heartbeat_timeout_s": 60, "hang_timeout_s": 60})
    sched.heartbeats = True
    sched.tick = 30.0

    def progress(s: FakeScheduler) -> None:
        s.set("*", {"step": s.polls})
        if s.polls == 10:
            s.set("trainer", ActorStage.FINISH)

    sched.on("poll", progress)
    manager.run()

    assert fake_clock() - 1_000.0 == 300.0  # five heartbeat timeouts of fake time went by
    assert manager.state.exit_code == EXIT_OK
    assert not {"heartbeat_timeout", "hang"} & set(kinds(manager.state))


def test_hang_ends_the_job_after_hang_timeout(
    make_manager: ManagerFactory, store: RecordingStore, fake_clock: FakeClock
) -> None:
    manager, sched = make_manager(health={"hang_timeout_s": 30}, limits={"global_restart_budget": 0})
    sched.heartbeats = True  # alive, but the step never moves
    sched.tick = 10.0
    sched.script({"*": {"step": 5}})
    manager.run()

    # Step first seen at 1010; 1020, 1030, 1040 are within 30 s; 1050 is 40 s later.
    assert sched.polls == 5
    assert fake_clock() == 1_050.0
    reason = assert_failed_and_cleaned(manager, sched, store)
    assert reason.startswith(
        f"global_restart_budget=0 used up (0 job-level restarts); culprit: {T0} on node node-0 (hang): training step stuck at 5 for 40s (hang timeout 30s)"
    )


# setup and scheduling failures -----------------------------------------------------------------
@pytest.mark.parametrize("method", ["setup", "check_children"])
def test_failed_self_check_stops_the_job_never_stuck_in_init_or_ready(
    method: str, make_manager: ManagerFactory, store: RecordingStore
) -> None:
    manager, sched = make_manager()
    if method == "setup":
        sched.setup_failures[T1] = "no CUDA device visible"
    else:
        sched.fail_with[method] = ActorSetupError(T1, "node check failed: allreduce timed out")
    manager.run()

    state = manager.state
    assert state.stage is JobStage.STOPPED
    assert state.exit_code == EXIT_FAILED
    assert state.reason.startswith(f"{T1} failed its self check: ")
    assert "start" not in sched.methods() and "poll" not in sched.methods()
    assert sched.methods()[-2:] == ["stop", "cleanup"]
    assert sched.only_call("cleanup").stored_stage is JobStage.STOPPING
    assert sched.only_call("stop").names == (T0,)
    assert state.actors[T1].stage is ActorStage.FAILED
    assert transitions(state) == ["INIT -> STOPPING", "STOPPING -> STOPPED"]
    assert JobStage.READY not in {p.stage for p in store.puts}
    assert_stored_matches(store, manager)


def test_unexpected_error_in_setup_stops_the_job(make_manager: ManagerFactory, store: RecordingStore) -> None:
    manager, sched = make_manager()
    sched.fail_with["setup"] = RuntimeError("actor handle lost")
    manager.run()

    assert manager.state.stage is JobStage.STOPPED
    assert manager.state.exit_code == EXIT_FAILED
    assert manager.state.reason == "PrimeMaster error: RuntimeError: actor handle lost"
    assert sched.methods()[-2:] == ["stop", "cleanup"]
    assert_stored_matches(store, manager)


def test_scheduling_error_stops_the_job(make_manager: ManagerFactory, store: RecordingStore) -> None:
    manager, sched = make_manager()
    sched.fail_with["prepare"] = SchedulingError("the cluster has 2 CPUs, the job needs 4")
    manager.run()

    assert manager.state.stage is JobStage.STOPPED
    assert manager.state.exit_code == EXIT_FAILED
    assert manager.state.reason == "cannot schedule the job: the cluster has 2 CPUs, the job needs 4"
    assert sched.methods() == ["prepare", "stop", "cleanup"]
    assert sched.only_call("cleanup").stored_stage is JobStage.STOPPING
    assert transitions(manager.state) == ["INIT -> STOPPING", "STOPPING -> STOPPED"]
    assert_stored_matches(store, manager)


@pytest.mark.parametrize("method", ["stop", "cleanup"])
def test_a_failing_stop_or_cleanup_still_ends_in_stopped(
    method: str, make_manager: ManagerFactory, store: RecordingStore
) -> None:
    manager, sched = make_manager(limits={"global_restart_budget": 0})
    sched.script({}, {T1: {"stage": ActorStage.FAILED, "error": TRACEBACK}})
    sched.fail_with[method] = RuntimeError(f"{method} blew up")
    manager.run()

    assert manager.state.stage is JobStage.STOPPED  # never left in STOPPING with a driver waiting
    assert manager.state.exit_code == EXIT_FAILED
    assert f"culprit: {T1} on node node-1 (failed)" in manager.state.reason  # the first reason is kept
    assert sched.methods()[-2:] == ["stop", "cleanup"]  # cleanup runs even when stop fails
    failed_steps = [e.message for e in manager.state.events if e.kind == f"{method}_failed"]
    assert failed_steps == [f"RuntimeError: {method} blew up"]
    assert_stored_matches(store, manager)


# stop requests ---------------------------------------------------------------------------------
def test_request_stop_from_another_thread_wakes_the_loop(
    make_manager: ManagerFactory, store: RecordingStore
) -> None:
    manager, sched = make_manager(health={"monitor_interval_s": 60})  # only a wake-up ends the wait
    polled = threading.Event()
    sched.on("poll", lambda s: polled.set())
    errors: list[BaseException] = []

    def run() -> None:
        try:
            manager.run()
        except BaseException as exc:
            errors.append(exc)

    runner = threading.Thread(target=run, daemon=True)
    runner.start()
    assert polled.wait(5), "the manager never reached RUNNING"
    manager.request_stop("operator pressed ctrl-c")
    runner.join(5)
    assert not runner.is_alive(), "request_stop did not wake the monitor loop"
    assert errors == []

    assert manager.state.stage is JobStage.STOPPED
    assert manager.state.exit_code == EXIT_STOPPED
    assert manager.state.reason == "operator pressed ctrl-c"
    assert sched.only_call("stop").names == (T0, T1)
    assert sched.only_call("cleanup").stored_stage is JobStage.STOPPING
    assert_stored_matches(store, manager)


def test_request_stop_while_running_stops_before_the_next_poll(make_manager: ManagerFactory) -> None:
    manager, sched = make_manager()

    def stop_from_another_thread(s: FakeScheduler) -> None:
        if s.polls == 2:
            caller = threading.Thread(target=manager.request_stop)
            caller.start()
            caller.join()

    sched.on("poll", stop_from_another_thread)
    manager.run()

    assert sched.polls == 2
    assert manager.state.exit_code == EXIT_STOPPED
    assert manager.state.reason == "stopped by user request"
    assert transitions(manager.state)[-2:] == ["RUNNING -> STOPPING", "STOPPING -> STOPPED"]


def test_request_stop_during_prepare_stops_without_starting(
    make_manager: ManagerFactory, store: RecordingStore
) -> None:
    manager, sched = make_manager()
    sched.on("prepare", lambda s: manager.request_stop("cancelled while placing"))
    manager.run()

    assert sched.methods() == ["prepare", "stop", "cleanup"]
    assert sched.only_call("stop").names == (T0, T1)
    assert manager.state.stage is JobStage.STOPPED
    assert manager.state.exit_code == EXIT_STOPPED
    assert manager.state.reason == "cancelled while placing"
    assert transitions(manager.state) == ["INIT -> STOPPING", "STOPPING -> STOPPED"]
    assert_stored_matches(store, manager)


def test_request_stop_during_setup_stops_without_starting(make_manager: ManagerFactory) -> None:
    manager, sched = make_manager()
    sched.on("setup", lambda s: manager.request_stop())
    manager.run()

    assert "start" not in sched.methods()
    assert manager.state.exit_code == EXIT_STOPPED
    assert transitions(manager.state) == ["INIT -> READY", "READY -> STOPPING", "STOPPING -> STOPPED"]


# fencing ---------------------------------------------------------------------------------------
def write_as_another_master(store: RecordingStore) -> int:
    """Another PrimeMaster takes the job over: it writes with the current token."""
    stored = store.state(JOB)
    assert stored is not None
    stored.record("master_restarted", "a newer PrimeMaster took over")
    return store.put(JOB, stored.dumps(), store.token(JOB))


@pytest.mark.parametrize("fenced_in", ["create", "prepare", "setup", "check_children", "start", "poll"])
def test_fenced_manager_stops_calling_the_scheduler(
    fenced_in: str, make_manager: ManagerFactory, store: RecordingStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    manager, sched = make_manager()
    sched.script({}, {"trainer": ActorStage.FINISH})
    takeover: list[int] = []
    if fenced_in == "create":
        takeover.append(write_as_another_master(store))
    else:
        sched.on(fenced_in, lambda s: takeover.append(write_as_another_master(store)))
    calls_when_fenced: list[int] = []
    put = store.put

    def watched_put(job: str, data: bytes, token: int | None) -> int:
        try:
            return put(job, data, token)
        except StateConflictError:
            calls_when_fenced.append(len(sched.calls))
            raise

    monkeypatch.setattr(store, "put", watched_put)

    with pytest.raises(FencedError, match="another PrimeMaster"):
        manager.run()

    # The first save after the takeover failed, and the scheduler was not called after it.
    assert calls_when_fenced == [len(sched.calls)]
    assert "cleanup" not in sched.methods() and "stop" not in sched.methods()
    assert manager.state.stage is not JobStage.STOPPED
    # Nothing overwrote the newer master's document.
    assert len(takeover) == 1 and store.token(JOB) == takeover[0]
    stored = store.state(JOB)
    assert stored is not None
    assert stored.events[-1].message == "a newer PrimeMaster took over"


def test_fenced_save_raises_fenced_error(make_manager: ManagerFactory, store: RecordingStore) -> None:
    manager, _ = make_manager()
    write_as_another_master(store)
    with pytest.raises(FencedError) as caught:
        manager.save()
    assert isinstance(caught.value.__cause__, StateConflictError)
    assert "job job" in str(caught.value)


# resubmission ----------------------------------------------------------------------------------
def test_resubmission_replaces_a_stopped_earlier_run(
    make_manager: ManagerFactory,
    make_spec: SpecFactory,
    fake_scheduler_factory: SchedulerFactory,
    store: RecordingStore,
    fake_clock: FakeClock,
) -> None:
    first, sched = make_manager()
    sched.script({}, {"trainer": ActorStage.FINISH})
    first.run()
    old_token = store.token(JOB)
    assert old_token is not None
    assert first.state.stage is JobStage.STOPPED

    spec = make_spec()
    again = fake_scheduler_factory(spec)
    second = PrimeManager.create(spec, again, store, clock=fake_clock)

    stored = store.state(JOB)
    assert stored is not None
    assert stored.run_id == second.state.run_id != first.state.run_id
    assert stored.stage is JobStage.INIT
    assert stored.exit_code is None and stored.reason == ""
    assert kinds(stored) == ["job_created"]
    assert {a.stage for a in stored.actors.values()} == {ActorStage.INIT}
    assert store.token(JOB) == old_token + 1
    assert again.calls == []  # creating touches nothing on the cluster

    # And the new run really runs instead of "finishing" on the old results.
    again.script({}, {}, {"trainer": ActorStage.FINISH})
    second.run()
    assert again.polls == 3
    assert "start" in again.methods()
    assert second.state.exit_code == EXIT_OK


# illegal transitions ---------------------------------------------------------------------------
ILLEGAL = [(a, b) for a in ALLOWED for b in JobStage if b not in ALLOWED[a]]


@pytest.mark.parametrize(("current", "target"), ILLEGAL, ids=[f"{a}->{b}" for a, b in ILLEGAL])
def test_illegal_transitions_raise_and_change_nothing(
    current: JobStage,
    target: JobStage,
    make_spec: SpecFactory,
    fake_scheduler_factory: SchedulerFactory,
    store: RecordingStore,
    fake_clock: FakeClock,
) -> None:
    spec = make_spec()
    state = new_state(spec)
    state.stage = current
    manager = PrimeManager(state, fake_scheduler_factory(spec), store, None, fake_clock)
    before = state.model_dump()
    with pytest.raises(IllegalTransition, match=f"^{current.value} -> {target.value}$"):
        manager.transition(target, "nope", exit_code=3)
    assert state.model_dump() == before
    assert store.puts == []


@pytest.mark.parametrize(
    ("current", "target"), [(JobStage.STOPPED, JobStage.RUNNING), (JobStage.INIT, JobStage.RUNNING)]
)
def test_named_illegal_transitions(
    current: JobStage, target: JobStage, make_manager: ManagerFactory, store: RecordingStore
) -> None:
    manager, _ = make_manager()
    manager.state.stage = current
    token = store.token(JOB)
    with pytest.raises(IllegalTransition):
        manager.transition(target)
    assert store.token(JOB) == token
    assert manager.state.stage is current


def test_every_legal_transition_is_allowed(make_manager: ManagerFactory) -> None:
    manager, _ = make_manager()
    for target in (JobStage.READY, JobStage.RUNNING, JobStage.INIT, JobStage.READY, JobStage.RUNNING):
        manager.transition(target)
    manager.transition(JobStage.STOPPING, "done", EXIT_OK)
    manager.transition(JobStage.STOPPED)
    assert transitions(manager.state) == [
        "INIT -> READY",
        "READY -> RUNNING",
        "RUNNING -> INIT",
        "INIT -> READY",
        "READY -> RUNNING",
        "RUNNING -> STOPPING",
        "STOPPING -> STOPPED",
    ]


def test_finish_and_run_after_stopped_do_nothing(make_manager: ManagerFactory, store: RecordingStore) -> None:
    manager, sched = make_manager()
    sched.fail_with["prepare"] = SchedulingError("no room")
    manager.run()
    calls, token = len(sched.calls), store.token(JOB)
    manager.finish(EXIT_OK, "again")
    manager.run()
    assert len(sched.calls) == calls and store.token(JOB) == token
    assert manager.state.reason == "cannot schedule the job: no room"


def test_run_from_a_saved_stopping_state_finishes_stopping(
    make_manager: ManagerFactory,
    fake_scheduler_factory: SchedulerFactory,
    store: RecordingStore,
    fake_clock: FakeClock,
) -> None:
    """A PrimeMaster that crashed in STOPPING: the next one only removes the job and stops."""
    first, _ = make_manager()
    first.transition(JobStage.STOPPING, "user asked", EXIT_STOPPED)
    stored = store.get(JOB)
    assert stored is not None
    state = JobState.loads(stored.data)
    sched = fake_scheduler_factory(state.spec)
    PrimeManager(state, sched, store, stored.token, fake_clock).run()
    assert sched.methods() == ["stop", "cleanup"]
    assert state.stage is JobStage.STOPPED and state.exit_code == EXIT_STOPPED


# the state document ----------------------------------------------------------------------------
def test_state_round_trip(make_spec: SpecFactory, make_role: RoleFactory) -> None:
    state = new_state(make_spec(roles=[make_role("trainer", 2), make_role("server", 1, is_driver=False)]))
    state.stage = JobStage.RUNNING
    state.actors[T0].restart_count = 2
    state.actors[T0].node_id = "abc"
    state.node_failures["abc"] = 3
    state.removed_nodes.append("def")
    state.roles["trainer"].escalation_count = 1
    state.record("failed", "boom", role="trainer", actor=T0, node_id="abc", at=5.0)
    loaded = JobState.loads(state.dumps())
    assert loaded == state
    assert loaded.dumps() == state.dumps()


@pytest.mark.parametrize("version", [0, None, "1", True])
def test_loads_rejects_an_unknown_schema_version(version: object, make_spec: SpecFactory) -> None:
    document = json.loads(new_state(make_spec()).dumps())
    if version is None:
        del document["schema_version"]
    else:
        document["schema_version"] = version
    with pytest.raises(ValueError, match=rf"schema version {version!r}; this dlu-prime reads versions 1 to"):
        JobState.loads(json.dumps(document).encode())


def test_loads_rejects_a_newer_schema_version(make_spec: SpecFactory) -> None:
    document = json.loads(new_state(make_spec()).dumps())
    document["schema_version"] = SCHEMA_VERSION + 1
    with pytest.raises(ValueError, match=rf"newer than this dlu-prime's {SCHEMA_VERSION}.*Upgrade dlu-prime"):
        JobState.loads(json.dumps(document).encode())


def test_loads_rejects_a_document_that_is_not_a_state() -> None:
    with pytest.raises(ValueError, match="schema version None"):
        JobState.loads(b"[1, 2]")


def test_event_timeline_is_bounded(make_spec: SpecFactory) -> None:
    state = new_state(make_spec())
    for i in range(MAX_EVENTS + 25):
        state.record("tick", f"event {i}", at=float(i))
    assert len(state.events) == MAX_EVENTS
    assert state.events[0].message == "event 25"
    assert state.events[-1].message == f"event {MAX_EVENTS + 24}"
    assert len(JobState.loads(state.dumps()).events) == MAX_EVENTS


def test_to_status_groups_actors_by_role_in_rank_order(
    make_spec: SpecFactory, make_role: RoleFactory
) -> None:
    state = new_state(make_spec(roles=[make_role("trainer", 12), make_role("server", 3, is_driver=False)]))
    shuffled = list(state.actors.items())
    shuffled = shuffled[7:] + shuffled[:7]
    shuffled.reverse()
    state.actors = dict(shuffled)
    state.roles["server"].restart_count = 4
    state.actors["job.trainer.10"].restart_count = 1
    for i in range(60):
        state.record("tick", str(i), at=float(i))

    status = state.to_status(events=5)
    assert [r.name for r in status.roles] == ["trainer", "server"]
    assert [a.rank for a in status.roles[0].actors] == list(range(12))
    assert [a.name for a in status.roles[1].actors] == ["job.server.0", "job.server.1", "job.server.2"]
    assert {a.role for a in status.roles[0].actors} == {"trainer"}
    assert status.roles[1].restart_count == 4
    assert status.roles[0].actors[10].restart_count == 1
    assert [e.message for e in status.events] == ["55", "56", "57", "58", "59"]
    assert state.to_status(events=0).events == []
    assert status.name == JOB and status.stage is JobStage.INIT


def test_state_document_stays_under_1kb_per_actor(make_spec: SpecFactory, make_role: RoleFactory) -> None:
    spec = make_spec(roles=[make_role("worker", 1000, resources={"cpu": 0})])
    state = new_state(spec)
    assert len(state.actors) == 1000
    for record in state.actors.values():  # a realistic, busy record: Ray node id, counters
        record.stage = ActorStage.RUNNING
        record.node_id = "f" * 56
        record.restart_count = 3
        record.total_failures = 3
    per_actor = len(state.dumps()) / 1000
    assert per_actor < 1024, f"{per_actor:.0f} bytes per actor"


def test_created_at_and_run_id_are_per_instance(make_spec: SpecFactory) -> None:
    spec = make_spec()
    first = JobState(spec=spec)
    time.sleep(0.01)
    second = JobState(spec=spec)
    assert second.created_at > first.created_at
    assert second.run_id != first.run_id


def test_defaults_follow_the_clock_not_the_import(
    make_spec: SpecFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`timestamp = int(time.time())` as a default is evaluated once (a known trap)."""
    now = [100.0]
    monkeypatch.setattr(time, "time", lambda: now[0])
    spec = make_spec()
    first = JobState(spec=spec)
    now[0] = 250.5
    second = JobState(spec=spec)
    event = second.record("x", "y")
    assert (first.created_at, first.updated_at) == (100.0, 100.0)
    assert (second.created_at, second.updated_at) == (250.5, 250.5)
    assert event.time == 250.5
