"""Stall detection as a pure function (`stall.judge`, `stall.waits`), and through the
PrimeManager's monitoring loop with a fake scheduler and clock: reported once per stall, cleared
when anything moves, never a failure, silent while the job progresses."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from dlu_api.errors import SpecError
from dlu_api.spec import spec_from_dict
from dlu_api.vocabulary import ActorStage
from dlu_prime.master.manager import EXIT_OK, new_state
from dlu_prime.master.stall import (
    ChannelView,
    StallMemory,
    describe,
    judge,
    latest_move,
    progress_marks,
    waits,
)
from dlu_prime.master.state import ChannelRecord, JobState
from dlu_prime.scheduler.base import ActorObservation

if TYPE_CHECKING:
    from conftest import FakeClock, FakeScheduler, ManagerFactory


def pipeline_state() -> JobState:
    """tokenizer x2 (not a driver) and trainer x1, all RUNNING, reading channels."""
    spec = spec_from_dict(
        {
            "name": "pipeline",
            "device_type": "CPU",
            "device_per_node": 0,
            "roles": [
                {"name": "tokenizer", "entrypoint": "pkg.t:main", "total": 2, "is_driver": False},
                {"name": "trainer", "entrypoint": "pkg.tr:main"},
            ],
        }
    )
    state = new_state(spec)
    for record in state.actors.values():
        record.stage = ActorStage.RUNNING
    return state


def running(step: int = 0, beats: int = 0) -> ActorObservation:
    return ActorObservation(stage=ActorStage.RUNNING, step=step, beats=beats, steps_reported=step > 0)


def observe(state: JobState, **steps: int) -> dict[str, ActorObservation]:
    return {name: running(steps.get(name.replace(".", "_"), 0)) for name in state.actors}


# judge -----------------------------------------------------------------------------------------
def test_judge_reports_once_after_the_timeout_and_clears_on_progress() -> None:
    memory, verdict = judge(StallMemory(), ("a",), None, 0.0, 60.0)
    assert verdict is None and memory.since == 0.0
    memory, verdict = judge(memory, ("a",), None, 59.0, 60.0)
    assert verdict is None
    memory, verdict = judge(memory, ("a",), None, 60.0, 60.0)
    assert verdict is True and memory.reported
    for now in (61.0, 120.0, 10_000.0):  # once per stall
        memory, verdict = judge(memory, ("a",), None, now, 60.0)
        assert verdict is None
    memory, verdict = judge(memory, ("b",), None, 10_001.0, 60.0)
    assert verdict is False and not memory.reported and memory.since == 10_001.0
    memory, verdict = judge(memory, ("b",), None, 10_061.0, 60.0)
    assert verdict is True  # a second stall is a new one


def test_judge_a_step_or_beat_that_moved_is_progress_an_old_one_is_not() -> None:
    memory, _ = judge(StallMemory(), ("a",), 5.0, 10.0, 30.0)
    for now in (20.0, 30.0):
        memory, verdict = judge(memory, ("a",), now, now, 30.0)  # moved this pass
        assert verdict is None and memory.since == now
    memory, verdict = judge(memory, ("a",), 30.0, 59.0, 30.0)  # nothing since 30
    assert verdict is None
    memory, verdict = judge(memory, ("a",), 30.0, 60.0, 30.0)
    assert verdict is True
    memory, verdict = judge(memory, ("a",), 61.0, 61.0, 30.0)
    assert verdict is False


def test_judge_off_and_busy_never_report() -> None:
    memory = StallMemory()
    for now in range(0, 1000, 10):
        memory, verdict = judge(memory, ("a",), None, float(now), None)
        assert verdict is None
    memory = StallMemory()
    for now in range(0, 1000, 10):
        memory, verdict = judge(memory, ("a",), None, float(now), 5.0, busy=True)
        assert verdict is None


def test_progress_marks_move_with_stages_channels_and_restarts() -> None:
    state = pipeline_state()
    marks = progress_marks(state, {})
    assert progress_marks(state, {}) == marks
    state.actors["pipeline.trainer.0"].stage = ActorStage.FINISH
    assert progress_marks(state, {}) != marks
    marks = progress_marks(state, {})
    state.roles["trainer"].inplace_restart_count += 1
    assert progress_marks(state, {}) != marks
    marks = progress_marks(state, {})
    state.channels["raw"] = ChannelRecord(name="raw", kind="channel", actor_name="pipeline.channel.raw")
    assert progress_marks(state, {}) != marks  # a channel created
    reader = {"raw": ChannelView("raw", getters=("pipeline.trainer.0",))}
    assert progress_marks(state, reader) != progress_marks(state, {"raw": ChannelView("raw")})
    assert progress_marks(state, {"raw": ChannelView("raw", put=0)}) != progress_marks(
        state, {"raw": ChannelView("raw", put=1)}
    )


def test_latest_move_takes_steps_and_worker_beats_not_a_submaster_serving_loop() -> None:
    state = pipeline_state()
    state.actors["pipeline.tokenizer.submaster"] = state.actors["pipeline.tokenizer.0"].model_copy(
        update={"name": "pipeline.tokenizer.submaster", "rank": -1}
    )
    assert latest_move(state, {}, {}) is None
    steps = {"pipeline.trainer.0": (3, 10.0), "pipeline.tokenizer.0": (0, 4.0)}
    assert latest_move(state, steps, {}) == 10.0
    assert latest_move(state, steps, {"pipeline.tokenizer.1": (7, 12.0)}) == 12.0
    assert latest_move(state, steps, {"pipeline.tokenizer.submaster": (900, 99.0)}) == 10.0


# what waits on what ----------------------------------------------------------------------------
def test_waits_names_the_channel_nobody_writes_and_its_waiting_roles() -> None:
    state = pipeline_state()
    channels = {
        "raw": ChannelView("raw", getters=("pipeline.tokenizer.0", "pipeline.tokenizer.1")),
        "batches": ChannelView("batches", put=3, delivered=3, getters=("pipeline.trainer.0",)),
    }
    found = waits(state, observe(state), channels)
    assert found == [
        "trainer rank 0 wait(s) on channel 'batches': nothing new put (3 so far)",
        "tokenizer ranks 0,1 wait(s) on channel 'raw': nobody has written to it",
    ]
    message = describe(found, 61.2, 60.0)
    assert message.startswith("no progress for 61s (health.stall_timeout_s 60): ")
    assert "not a failure" in message


def test_waits_names_ranks_that_never_reported_full_channels_and_unstarted_actors() -> None:
    state = pipeline_state()
    seen = observe(state)
    seen["pipeline.tokenizer.1"] = running(step=4)
    seen["pipeline.trainer.0"] = running(step=7)
    channels = {"out": ChannelView("out", put=16, queued=16, waiting_puts=1, getters=())}
    assert waits(state, seen, channels) == [
        "1 writer(s) wait on channel 'out': full (16 queued), nobody reads it",
        "tokenizer rank 0 never reported a step (heartbeat(step) reports progress)",
        "tokenizer rank 1 at step 4",
        "trainer rank 0 at step 7",
    ]
    state.actors["pipeline.tokenizer.1"].stage = ActorStage.READY
    seen["pipeline.tokenizer.1"] = ActorObservation(stage=ActorStage.READY)
    assert waits(state, seen, {})[0] == "tokenizer: 1 actor(s) still READY"


def test_a_role_that_never_reports_steps_is_no_finding() -> None:
    """An unmodified torchrun script never calls `heartbeat`: its silence says nothing about
    progress, so it is not named (and, alone, is no stall). A silent rank is named only where a
    peer of its role reports steps."""
    state = pipeline_state()
    assert waits(state, observe(state), {}) == []
    seen = observe(state)
    seen["pipeline.trainer.0"] = running(step=3)
    assert waits(state, seen, {}) == ["trainer rank 0 at step 3"]


def test_channel_view_reads_a_watch_answer() -> None:
    answer = {"put": 2, "delivered": 1, "queued": 1, "closed": False, "waiting_puts": 0, "getters": ["a"]}
    assert ChannelView.from_watch("raw", answer) == ChannelView("raw", 2, 1, 1, False, 0, ("a",))


# the spec field --------------------------------------------------------------------------------
@pytest.mark.parametrize("bad", [0, -1, float("inf"), float("nan"), "soon"])
def test_stall_timeout_must_be_a_positive_finite_number(bad: object) -> None:
    with pytest.raises(SpecError, match="stall_timeout_s"):
        spec_from_dict(
            {"name": "j", "roles": [{"name": "r", "entrypoint": "p:m"}], "health": {"stall_timeout_s": bad}}
        )


def test_stall_timeout_is_on_by_default_and_null_turns_it_off() -> None:
    spec = spec_from_dict({"name": "j", "roles": [{"name": "r", "entrypoint": "p:m"}]})
    assert spec.health.stall_timeout_s == 60.0
    spec = spec_from_dict(
        {"name": "j", "roles": [{"name": "r", "entrypoint": "p:m"}], "health": {"stall_timeout_s": None}}
    )
    assert spec.health.stall_timeout_s is None


# through the monitoring loop -------------------------------------------------------------------
def kinds(state: JobState) -> list[str]:
    return [e.kind for e in state.events]


def test_a_job_where_nothing_moves_is_reported_once_then_resumed_never_failed(
    make_manager: ManagerFactory, fake_clock: FakeClock
) -> None:
    manager, sched = make_manager(health={"stall_timeout_s": 30})
    sched.tick = 10.0

    def script(s: FakeScheduler) -> None:
        if s.polls == 1:  # rank 0 reports step 3 and stands there; rank 1 never reports
            s.set(s.names_of("trainer")[0], {"step": 3, "steps_reported": True})
        if s.polls >= 20:  # 190 s without a step, then a step every pass, then done
            s.set("*", {"step": s.polls, "steps_reported": True})
        if s.polls == 25:
            s.set("trainer", ActorStage.FINISH)

    sched.on("poll", script)
    manager.run()

    assert manager.state.exit_code == EXIT_OK
    assert kinds(manager.state).count("stalled") == 1
    assert kinds(manager.state).count("progress_resumed") == 1
    stalled = next(e for e in manager.state.events if e.kind == "stalled")
    assert "trainer rank 1 never reported a step" in stalled.message, stalled.message
    assert "trainer rank 0 at step 3" in stalled.message, stalled.message
    assert manager.state.first_failure is None  # a notice, not a failure
    assert manager.state.global_restart_count == 0 and manager.state.job_restart_count == 0


def test_soak_a_progressing_job_never_stalls(make_manager: ManagerFactory, fake_clock: FakeClock) -> None:
    """200 passes, 10 s apart, with a 15 s stall timeout: a step every pass, never reported."""
    manager, sched = make_manager(health={"stall_timeout_s": 15})
    sched.tick = 10.0

    def progress(s: FakeScheduler) -> None:
        s.set("*", {"step": s.polls})
        if s.polls == 200:
            s.set("trainer", ActorStage.FINISH)

    sched.on("poll", progress)
    manager.run()
    assert manager.state.exit_code == EXIT_OK
    assert "stalled" not in kinds(manager.state)


def test_soak_a_script_that_never_reports_steps_is_never_reported(
    make_manager: ManagerFactory, fake_clock: FakeClock
) -> None:
    """An unmodified torchrun script (no `heartbeat`): 200 passes, 10 s apart, with a 15 s
    stall timeout, every rank RUNNING at step 0: nothing can be named, so nothing is said."""
    manager, sched = make_manager(health={"stall_timeout_s": 15})
    sched.tick = 10.0

    def finish(s: FakeScheduler) -> None:
        if s.polls == 200:
            s.set("trainer", ActorStage.FINISH)

    sched.on("poll", finish)
    manager.run()
    assert manager.state.exit_code == EXIT_OK
    assert "stalled" not in kinds(manager.state) and "progress_resumed" not in kinds(manager.state)
