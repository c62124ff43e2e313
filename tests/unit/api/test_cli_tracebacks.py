"""A failure's traceback shows once in what `dlu run` and `dlu status` print, and each rank's
start marker once in `dlu run`'s tee."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator

from dlu_api.cli.render import event_line, one_line, status_text
from dlu_api.cli.tee import RankTee
from dlu_api.client.base import JobClient
from dlu_api.rank_logs import RankFile
from dlu_api.spec.models import JobSpec
from dlu_api.status import JobEvent, JobStage, JobStatus

TRACE = (
    "rank 1 exited 1: RuntimeError: boom\nTraceback (most recent call last):\n  File x\nRuntimeError: boom"
)


def _failed() -> JobStatus:
    failure = JobEvent(time=1.0, kind="process_failed", message=TRACE, role="trainer", actor="j.trainer.1")
    limit = JobEvent(
        time=2.0, kind="restart_limit", message="limit; culprit: " + TRACE, role="trainer", tier="in_place"
    )
    return JobStatus(
        name="j",
        stage=JobStage.STOPPED,
        exit_code=1,
        reason="limit; culprit: " + TRACE,
        first_failure=failure,
        events=[failure, limit],
    )


def test_one_line_keeps_the_first_line_and_says_what_it_left_out() -> None:
    assert one_line("plain") == "plain"
    assert one_line(TRACE) == "rank 1 exited 1: RuntimeError: boom (traceback elided)"


def test_status_text_shows_the_traceback_once() -> None:
    text = status_text(_failed(), events=10)
    assert text.count("Traceback (most recent call last)") == 1, text
    assert "reason: limit; culprit: rank 1 exited 1: RuntimeError: boom (traceback elided)" in text
    assert all("Traceback" not in event_line(e) for e in _failed().events)


def test_status_text_without_tracebacks_shows_none() -> None:
    assert "Traceback" not in status_text(_failed(), events=10, tracebacks=False)


def test_a_reason_with_no_root_cause_keeps_its_traceback() -> None:
    status = JobStatus(name="j", stage=JobStage.STOPPED, exit_code=1, reason=TRACE)
    assert status_text(status).count("Traceback (most recent call last)") == 1


class _Lines(JobClient):
    def __init__(self, lines: list[str]) -> None:
        self.lines = lines

    def tee_lines(
        self, status: JobStatus, wanted: Callable[[RankFile], bool], stop: threading.Event
    ) -> Iterator[str]:
        yield from self.lines

    # what the tee does not call
    submit = resume = wait = status = stop = logs = list_jobs = None  # type: ignore[assignment]


def test_the_tee_prints_each_start_marker_once_and_notes_a_traceback() -> None:
    marker = "==== dlu: trainer/rank0 started at 2026-01-01 00:00:00 (round 1, restart 0) ===="
    lines = [
        f"[trainer/rank0] {marker}",
        f"[trainer/rank0:err] {marker}",
        "[trainer/rank0] hello",
        "[trainer/rank0:err] Traceback (most recent call last):",
        "[trainer/rank0:err] RuntimeError: boom",
    ]
    spec = JobSpec.model_validate(
        {
            "name": "j",
            "device_type": "CPU",
            "device_per_node": 0,
            "logs": {"tee": 3},
            "roles": [{"name": "trainer", "entrypoint": "m:f", "total": 1}],
        }
    )
    shown: list[str] = []
    tee = RankTee(_Lines(lines), spec, shown.append)
    tee.see(JobStatus(name="j", stage=JobStage.RUNNING, run_id="r1"))
    tee.stop()
    assert shown == [lines[0], *lines[2:]]
    assert tee.traceback_shown
