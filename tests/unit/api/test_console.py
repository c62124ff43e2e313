"""The console of `dlu run`: the model (statuses -> what is shown), the rich view of a terminal
and the plain lines of a pipe."""

from __future__ import annotations

import io
import re
import warnings

import pytest
from rich.console import Console

from dlu_api.cli.console import LiveConsole, PlainConsole, job_console, quiet_python_warnings
from dlu_api.cli.console_model import ConsoleModel, ConsoleState, StepRate
from dlu_api.cli.console_view import render
from dlu_api.cli.render import role_line
from dlu_api.status import ActorStatus, JobEvent, JobStage, JobStatus, RoleStatus

pytestmark = pytest.mark.timeout(30)

SUB = -1  # a SubMaster's rank


class Timeline:
    """A job's timeline as the PrimeMaster numbers it; `poll` answers as `wait_job` forwards it:
    the retained events, at most `keep` of the newest."""

    def __init__(self, keep: int = 500) -> None:
        self.events: list[JobEvent] = []
        self.keep = keep

    def add(self, kind: str, message: str, **fields: object) -> JobEvent:
        event = JobEvent.model_validate(
            {"time": 1000.0 + len(self.events), "kind": kind, "message": message, "seq": len(self.events) + 1}
            | fields
        )
        self.events.append(event)
        return event

    def poll(self, **fields: object) -> JobStatus:
        data: dict[str, object] = {
            "name": "job",
            "stage": JobStage.RUNNING,
            "events": self.events[-self.keep :],
        }
        return JobStatus.model_validate(data | fields)


def trainer(
    stage: str, steps: list[int | None], sub_master: str | None = None, **fields: object
) -> RoleStatus:
    actors = [
        ActorStatus(name=f"job.trainer.{rank}", role="trainer", rank=rank, stage=stage, step=step)
        for rank, step in enumerate(steps)
    ]
    if sub_master is not None:
        actors.insert(
            0, ActorStatus(name="job.trainer.submaster", role="trainer", rank=SUB, stage=sub_master)
        )
    data: dict[str, object] = {"name": "trainer", "kind": "elastic", "size": len(steps), "actors": actors}
    return RoleStatus.model_validate(data | fields)


# the model ----------------------------------------------------------------------------------------


def test_every_event_is_counted_past_200_and_the_tail_is_the_newest() -> None:
    timeline, model = Timeline(keep=50), ConsoleModel(recent=5)
    for burst in range(6):  # 270 events, more between two polls than the answer's tail holds
        for i in range(45):
            timeline.add("note", f"event {burst * 45 + i}")
        state = model.update(timeline.poll(events=timeline.events[-45:]), now=float(burst))
    assert state.event_count == 270
    assert [e.message for e in state.recent] == [f"event {i}" for i in range(265, 270)]


def test_root_cause_is_the_first_failure_of_the_whole_timeline() -> None:
    timeline, model = Timeline(keep=50), ConsoleModel()
    timeline.add("died", "the first one", role="trainer", actor="job.trainer.0")
    model.update(timeline.poll(), now=0.0)
    for i in range(300):  # far past it: the PrimeMaster's answers no longer hold it
        timeline.add("failed" if i % 10 == 0 else "note", f"later {i}", role="trainer")
    state = model.update(timeline.poll(events=timeline.events[1:]), now=1.0)
    assert state.first_failure is not None and state.first_failure.message == "the first one"
    assert state.incident_count == 31


def test_the_masters_first_failure_wins_over_what_the_console_saw() -> None:
    """A console that joined late (`dlu resume`) never saw the first failure: the PrimeMaster's."""
    timeline, model = Timeline(), ConsoleModel()
    first = JobEvent(time=1.0, kind="died", message="before this console", actor="job.trainer.1")
    timeline.add("failed", "seen here", role="trainer")
    state = model.update(timeline.poll(first_failure=first), now=0.0)
    assert state.first_failure == first


def test_a_finished_role_shows_its_final_step_and_no_running_sub_master() -> None:
    model = ConsoleModel()
    running = JobStatus(name="job", stage=JobStage.RUNNING, roles=[trainer("RUNNING", [28, 29], "RUNNING")])
    row = model.update(running, now=0.0).roles[0]
    assert row.sub_master == "RUNNING" and row.step == 29
    done = JobStatus(name="job", stage=JobStage.RUNNING, roles=[trainer("FINISH", [30, 30], "RUNNING")])
    row = model.update(done, now=1.0).roles[0]
    assert row.states == (("FINISH", 2),)
    assert row.sub_master is None  # the SubMaster is never counted with the ranks, nor shown RUNNING
    assert row.step == 30
    assert row.steps_per_s is None


def test_steps_per_second_from_the_steps_the_role_reports() -> None:
    rate = StepRate()
    assert rate.add(0.0, 0) is None
    assert rate.add(2.0, 10) == pytest.approx(5.0)
    assert rate.add(4.0, 30) == pytest.approx(7.5)
    assert rate.add(5.0, 8) is None  # resumed from a checkpoint: measured afresh
    assert rate.add(6.0, 10) == pytest.approx(2.0)
    for t in range(7, 40):  # stalled, then 100 steps/s: only the last ~10 s count
        rate.add(float(t), 10 + (t - 30) * 100 if t > 30 else 10)
    assert rate.add(40.0, 1010) == pytest.approx(100.0, rel=0.2)
    assert rate.add(41.0, None) is None


def test_the_metric_is_the_lowest_reporting_ranks_and_restarts_are_by_tier() -> None:
    role = trainer("RUNNING", [5, 5, 5], inplace_restart_count=2, restart_count=1)
    role.actors[0].metric = None
    role.actors[1].metric = 2.5
    role.actors[2].metric = 9.0
    status = JobStatus(name="job", stage=JobStage.RUNNING, roles=[role], node_restart_count=1)
    state = ConsoleModel().update(status, now=0.0)
    assert state.roles[0].metric == 2.5
    assert state.restarts == (("in place", 2), ("role", 1), ("node", 1))


def test_each_failure_and_its_recovery_with_its_duration() -> None:
    timeline, model = Timeline(), ConsoleModel()
    timeline.add("inplace_restart", "restart 1/3: rank 1 exited 1", role="trainer", actor="job.trainer.1")
    state = model.update(timeline.poll(), now=0.0)
    assert len(state.incidents) == 1 and state.incidents[0].recovered_by is None  # recovering
    timeline.add("failover_done", "training again", role="trainer", tier="in_place", duration_s=1.5)
    timeline.add("died", "actor died", role="worker", actor="job.worker.0")
    state = model.update(timeline.poll(), now=1.0)
    inplace, died = state.incidents
    assert (inplace.kind, inplace.recovered_by, inplace.tier, inplace.duration_s) == (
        "inplace_restart",
        "failover_done",
        "in_place",
        1.5,
    )
    assert inplace.where == "trainer/job.trainer.1"
    assert died.recovered_by is None


# the terminal view --------------------------------------------------------------------------------

ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def screen_text(state_status: list[JobStatus], width: int = 160) -> str:
    model, console = ConsoleModel(), Console(record=True, width=width, file=io.StringIO())
    state = None
    for t, status in enumerate(state_status):
        state = model.update(status, now=float(t))
    assert state is not None
    console.print(render(state))
    return console.export_text()


def crashed_and_finished() -> list[JobStatus]:
    timeline = Timeline()
    timeline.add("stage", "READY -> RUNNING: job started")
    running = timeline.poll(roles=[trainer("RUNNING", [3, 3], "RUNNING")])
    timeline.add("inplace_restart", "restart 1/3: rank 1 exited 1", role="trainer", actor="job.trainer.1")
    timeline.add("failover_done", "training again", role="trainer", tier="in_place", duration_s=1.25)
    for i in range(250):
        timeline.add("note", f"note {i}")
    role = trainer("FINISH", [30, 30], "RUNNING", inplace_restart_count=1)
    role.actors[1].metric = 1.875
    done = timeline.poll(
        stage=JobStage.STOPPED, exit_code=0, reason="every driver role finished", roles=[role]
    )
    return [running, done]


def test_the_terminal_screen_of_a_finished_job() -> None:
    text = screen_text(crashed_and_finished())
    assert "job job  STOPPED (exit code 0)" in text
    assert "253 event(s)" in text
    row = next(line for line in text.splitlines() if line.startswith("trainer"))
    assert "2 FINISH" in row and " 30 " in row and "1.875" in row and "1 in place" in row
    assert "SubMaster" not in text and "RUNNING" not in text
    assert "restarts: in place 1" in text
    assert "root cause: trainer.1 (inplace_restart): restart 1/3" in text
    assert "recovered in 1.25s (in_place tier)" in text
    assert "latest events" not in text  # the end shows what happened, not the last notes


def test_the_terminal_screen_of_a_running_job() -> None:
    timeline = Timeline()
    timeline.add("died", "actor died", role="trainer", actor="job.trainer.0")
    text = screen_text([timeline.poll(roles=[trainer("RUNNING", [3, 3], "RUNNING")])])
    assert "2 RUNNING + SubMaster" in text
    assert "recovering ..." in text
    assert "latest events:" in text and "actor died" in text


def test_the_live_console_leaves_the_final_screen_in_the_terminal() -> None:
    out = io.StringIO()
    live = LiveConsole(Console(file=out, force_terminal=True, width=160), clock=iter(range(100)).__next__)
    running, done = crashed_and_finished()
    live(running)
    assert "trainer" in ANSI.sub("", out.getvalue())  # the first status is drawn at once
    live(running)
    live.stop()
    live.stop()  # twice is harmless
    live.close(done)
    raw = out.getvalue()
    final = ANSI.sub("", raw.rsplit("\x1b[2K", 1)[-1])  # after the live frames were erased
    assert final.lstrip().startswith("job job  STOPPED (exit code 0)")
    assert "recovered in 1.25s (in_place tier)" in final and "2 FINISH" in final


# plain lines --------------------------------------------------------------------------------------


def test_plain_mode_prints_one_line_per_event_past_200_then_the_final_status() -> None:
    lines: list[str] = []
    plain = PlainConsole(lines.append)
    timeline = Timeline(keep=50)
    for burst in range(5):
        for i in range(50):
            timeline.add("note", f"event {burst * 50 + i}")
        plain(timeline.poll(events=timeline.events[-50:]))
    plain.stop()
    plain.close(timeline.poll(stage=JobStage.STOPPED, exit_code=0, events=timeline.events[-50:]))
    printed = [line.split("note", 1)[1].strip() for line in lines if " note " in line]
    assert printed == [f"event {i}" for i in range(250)]
    assert "job job: STOPPED (exit code 0)" in lines[-1]
    assert not any("\x1b[" in line for line in lines)


def test_the_live_view_only_for_a_terminal() -> None:
    assert isinstance(job_console(print, live=False), PlainConsole)
    assert isinstance(job_console(print, live=True), LiveConsole)


def test_a_plain_role_line_counts_the_ranks_and_keeps_the_sub_master_apart() -> None:
    running = trainer("RUNNING", [3, 4], "RUNNING")
    assert (
        role_line(running, with_step=True)
        == "  trainer (elastic): size 2, 2 RUNNING + SubMaster RUNNING, step 4"
    )
    done = trainer("FINISH", [30, 30], "STOPPED")
    assert role_line(done, with_step=True) == "  trainer (elastic): size 2, 2 FINISH, step 30"


def test_quiet_hides_the_python_warnings_of_rays_modules_only() -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        quiet_python_warnings()
        for module in ("ray.actor", "ray", "raylike", "dlu_prime.launcher"):
            warnings.warn_explicit(f"from {module}", UserWarning, "x.py", 1, module=module)
    assert [str(w.message) for w in caught] == ["from raylike", "from dlu_prime.launcher"]


# the stall notice -------------------------------------------------------------------------------


def drawn(state: ConsoleState) -> str:
    out = io.StringIO()
    Console(file=out, width=100, color_system=None).print(render(state))
    return out.getvalue()


def test_a_stall_notice_shows_whole_until_progress_resumes_or_the_job_ends() -> None:
    from dlu_api.cli.render import status_text

    timeline, model = Timeline(), ConsoleModel(recent=2)
    message = (
        "no progress for 60s (health.stall_timeout_s 60): tokenizer ranks 0,1 wait(s) on channel "
        "'raw': nobody has written to it (a notice, not a failure: nothing is restarted)"
    )
    timeline.add("stalled", message)
    state = model.update(timeline.poll(), now=0.0)
    assert state.stalled == message
    assert "channel 'raw': nobody has written to it" in " ".join(drawn(state).split())
    assert f"stalled: {message}" in status_text(timeline.poll())
    timeline.add("note", "something else")
    timeline.add("note", "and more")  # the notice scrolled out of the recent events: still shown
    assert model.update(timeline.poll(), now=1.0).stalled == message
    timeline.add("progress_resumed", "progress resumed")
    state = model.update(timeline.poll(), now=2.0)
    assert state.stalled is None and "stalled:" not in drawn(state)
    assert "stalled:" not in status_text(timeline.poll())
    timeline.add("stalled", message)
    assert model.update(timeline.poll(stage=JobStage.STOPPED), now=3.0).stalled is None
    assert "stalled:" not in status_text(timeline.poll(stage=JobStage.STOPPED))
