"""Every event reaches a follower whatever the count, the root cause is the job's first failure,
and a finished role shows its final step and no RUNNING SubMaster."""

from __future__ import annotations

import pytest

from dlu_api.cli.render import ProgressPrinter, status_text
from dlu_api.spec import spec_from_dict
from dlu_api.spec.models import JobSpec
from dlu_api.status import EventCursor, JobEvent, JobStatus
from dlu_api.vocabulary import ActorStage
from dlu_prime.master.liveness import Liveness
from dlu_prime.master.manager import new_state
from dlu_prime.master.state import MAX_EVENTS, SUB_MASTER_RANK, ActorRecord, JobState
from dlu_prime.scheduler.base import ActorObservation

pytestmark = pytest.mark.timeout(30)


def build_spec(trainers: int = 2) -> JobSpec:
    role = {"name": "trainer", "entrypoint": "pkg.trainer:main", "total": trainers}
    return spec_from_dict({"name": "job", "device_type": "CPU", "device_per_node": 0, "roles": [role]})


def _follow(state: JobState, cursor: EventCursor, timeline: list[JobEvent]) -> JobStatus:
    """One poll as `launcher.wait_job` makes it: only the events past the cursor."""
    answer = state.to_status(0, cursor.position)
    timeline[:] = (timeline + cursor.take(answer.events))[-MAX_EVENTS:]
    return answer.model_copy(update={"events": list(timeline)})


def test_a_follower_prints_every_event_beyond_the_default_tail() -> None:
    state = new_state(build_spec())
    lines: list[str] = []
    printer = ProgressPrinter(lines.append)
    cursor, timeline = EventCursor(), list[JobEvent]()
    for burst in range(6):  # 6 x 45 = 270 events, more per poll than nothing but the tail of 50
        for i in range(45):
            state.record("note", f"event {burst * 45 + i}")
        printer(_follow(state, cursor, timeline))
    printed = [line.split("note", 1)[1].strip() for line in lines if " note " in line]
    assert printed == [f"event {i}" for i in range(270)]
    assert cursor.position == state.event_seq == 270


def test_a_follower_loses_nothing_when_the_timeline_drops_old_events() -> None:
    state = new_state(build_spec())
    cursor = EventCursor()
    seen: list[str] = []
    for burst in range(3):
        for i in range(MAX_EVENTS - 1):  # nearly a whole timeline between two polls
            state.record("note", f"{burst}.{i}")
        seen += [e.message for e in cursor.take(state.to_status(MAX_EVENTS).events)]
    assert seen == [f"{b}.{i}" for b in range(3) for i in range(MAX_EVENTS - 1)]


def test_root_cause_is_the_first_failure_of_the_whole_job() -> None:
    state = new_state(build_spec())
    state.record("died", "the first one", actor="job.trainer.0")
    for i in range(MAX_EVENTS):
        state.record("failed" if i % 10 == 0 else "note", f"later {i}", actor="job.trainer.1")
    status = state.to_status()
    assert all(e.message != "the first one" for e in status.events)
    text = status_text(status)
    assert "first failure: job.trainer.0 (died): the first one" in text
    assert "later" not in text.split("first failure:", 1)[1].splitlines()[0]


def test_a_finished_actor_keeps_its_final_step() -> None:
    liveness = Liveness()
    running = ActorObservation(stage=ActorStage.RUNNING, step=29, steps_reported=True)
    liveness.track({"job.trainer.0": running}, now=1.0)
    liveness.track({"job.trainer.0": ActorObservation(stage=ActorStage.FINISH, step=0)}, now=2.0)
    assert liveness.last_steps() == {"job.trainer.0": 29}
    assert liveness.steps == {}  # hang tracking forgets it


def test_a_finished_roles_sub_master_is_not_shown_running() -> None:
    spec = build_spec(2)
    state = new_state(spec)
    sub = "job.trainer.submaster"
    state.actors[sub] = ActorRecord(name=sub, role="trainer", rank=SUB_MASTER_RANK, stage=ActorStage.RUNNING)
    for name, record in state.actors.items():
        if record.rank != SUB_MASTER_RANK:
            state.actors[name].stage = ActorStage.FINISH
    stages = {a.name: a.stage for a in state.to_status().roles[0].actors}
    assert stages[sub] == "FINISH"
    state.actors["job.trainer.0"].stage = ActorStage.RUNNING
    stages = {a.name: a.stage for a in state.to_status().roles[0].actors}
    assert stages[sub] == "RUNNING"
