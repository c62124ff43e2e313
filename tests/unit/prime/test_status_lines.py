"""The launcher's DLU-STATUS lines between stage changes, and the driver putting the timeline
back together from them: what a remote `dlu run` draws its console from."""

from __future__ import annotations

import pytest

from dlu_api.client import wire
from dlu_api.status import ActorStatus, JobEvent, JobStage, JobStatus, RoleStatus
from dlu_prime.status_lines import StatusLines

pytestmark = pytest.mark.timeout(30)


def status(stage: JobStage, step: int, events: list[JobEvent]) -> JobStatus:
    actor = ActorStatus(name="j.w.0", role="w", rank=0, stage="RUNNING", step=step)
    return JobStatus(
        name="j", stage=stage, roles=[RoleStatus(name="w", kind="simple", actors=[actor])], events=events
    )


def events(n: int) -> list[JobEvent]:
    return [JobEvent(time=float(i), kind="note", message=f"e{i}", seq=i) for i in range(1, n + 1)]


def parsed(line: str | None) -> JobStatus:
    assert line is not None
    found = wire.parse_log(line).status
    assert found is not None
    return found


def test_stage_changes_carry_the_timeline_and_progress_lines_only_new_events() -> None:
    lines = StatusLines(every_s=2.0)
    first = parsed(lines.line(status(JobStage.RUNNING, 0, events(3)), now=0.0))
    assert [e.seq for e in first.events] == [1, 2, 3]
    assert lines.line(status(JobStage.RUNNING, 1, events(4)), now=1.0) is None  # not due yet
    assert lines.line(status(JobStage.RUNNING, 2, events(5)), now=1.5) is None
    progress = parsed(lines.line(status(JobStage.RUNNING, 3, events(5)), now=2.5))
    assert [e.seq for e in progress.events] == [4, 5]  # both polls' new events, once
    assert progress.roles[0].actors[0].step == 3
    assert lines.line(status(JobStage.RUNNING, 3, events(5)), now=10.0) is None  # nothing changed
    stopped = parsed(lines.line(status(JobStage.STOPPED, 3, events(6)), now=10.5))
    assert [e.seq for e in stopped.events] == [1, 2, 3, 4, 5, 6]


def test_the_driver_puts_the_timeline_back_together() -> None:
    lines = StatusLines(every_s=1.0)
    log = [lines.line(status(JobStage.RUNNING, 0, events(2)), now=0.0)]
    timeline = events(2)
    for t in range(1, 6):
        timeline += [JobEvent(time=float(t), kind="note", message=f"later {t}", seq=len(timeline) + 1)]
        log.append(lines.line(status(JobStage.RUNNING, t, timeline), now=float(t)))
    report = wire.parse_log("\n".join(line for line in log if line is not None))
    assert report.status is not None
    assert [e.seq for e in report.status.events] == list(range(1, 8))
    assert report.status.roles[0].actors[0].step == 5  # the latest line's roles


def test_statuses_without_positions_are_read_as_they_are() -> None:
    old = [JobEvent(time=1.0, kind="note", message="old")]
    text = "\n".join(wire.status_line(status(JobStage.RUNNING, s, old)) for s in (1, 2))
    report = wire.parse_log(text)
    assert report.status is not None and report.status.events == old
