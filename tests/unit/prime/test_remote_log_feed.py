"""A remote driver follows a long job's launcher log without reading it again at every poll.

The Jobs API returns a job's whole log per request, and `dlu run`/`wait`, `dlu events -f` and
the wait for a `dlu stop` or `dlu debug` answer re-read it at every poll: 20 MB a poll for a day
of a 4-rank job. Over the fake's copy of Ray's log API (whole file, tail, stream of what is
appended), each byte of the log now goes over the wire at most twice (the first read, and once
more in the stream that follows it), a request's answer is read from a stream opened at the
log's end, and a stream that breaks is opened again without an event counted twice.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest
from fake_jobs_api import SPEC, FakeJobsApi, serve, until

from dlu_api.client import wire
from dlu_api.client.launcher_feed import LauncherFeed, follow_human_lines, read_head
from dlu_api.client.remote import RemoteJobClient
from dlu_api.spec.models import JobSpec
from dlu_api.status import ActorStatus, JobStage, JobStatus, RoleStatus

pytestmark = pytest.mark.timeout(60)

OLD_STATUSES = 3000  # a long run's history, written before the driver attaches (about 0.9 MB)


@pytest.fixture
def api(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[FakeJobsApi, str]]:
    with serve(monkeypatch, log_api=True) as served:
        yield served


def _long_running_job(fake: FakeJobsApi, client: RemoteJobClient) -> str:
    """Submitted and RUNNING, with `OLD_STATUSES` status lines of history in its log."""
    client.submit(JobSpec.model_validate(SPEC))
    until(lambda: client.status("demo").stage is JobStage.RUNNING)
    (sid,) = fake.jobs
    job = fake.jobs[sid]
    for step in range(OLD_STATUSES):
        actors = [
            ActorStatus(name=f"demo.worker.{r}", role="worker", rank=r, stage="RUNNING", step=step)
            for r in (0, 1)
        ]
        job.emit(
            wire.status_line(
                JobStatus(
                    name="demo",
                    stage=JobStage.RUNNING,
                    roles=[RoleStatus(name="worker", kind="custom", actors=actors)],
                )
            )
        )
    return sid


def _waited(client: RemoteJobClient, polls: int) -> tuple[threading.Thread, list[JobStatus], list[JobStatus]]:
    """`wait` in a thread; returns it, the statuses it reported, and (once it returned) its result."""
    seen: list[JobStatus] = []
    result: list[JobStatus] = []
    thread = threading.Thread(target=lambda: result.append(client.wait("demo", seen.append)), daemon=True)
    thread.start()
    until(lambda: len(seen) >= polls)
    return thread, seen, result


def test_wait_reads_a_long_log_once_not_at_every_poll(api: tuple[FakeJobsApi, str]) -> None:
    fake, address = api
    client = RemoteJobClient(address, poll_interval_s=0.02)
    sid = _long_running_job(fake, client)
    before = fake.log_bytes_sent
    thread, seen, result = _waited(client, polls=30)  # the launcher's steps change it every 0.2 s
    # Some 6 s, a dozen stream intervals, nothing broken: one stream, never opened again.
    assert sum(1 for _, path in fake.requests if path == "/api/v0/logs/stream") == 1
    client.stop("demo")
    thread.join(20)
    assert (
        result
        and result[0].finished
        and (result[0].exit_code, result[0].reason) == (130, "stopped by user request")
    )
    assert [e.message for e in result[0].events] == ["INIT", "RUNNING"]  # each event once
    read = fake.log_bytes_sent - before
    size = fake.log_bytes(sid, -1)[1]
    # Each byte at most twice (the first read and the stream behind it), plus what `stop` read;
    # re-reading at every poll cost `size` per poll (30+ polls here).
    assert read < 3 * size, (read, size, len(seen))
    assert seen[-1].finished


def test_a_broken_stream_is_opened_again_and_no_event_counts_twice(api: tuple[FakeJobsApi, str]) -> None:
    fake, address = api
    client = RemoteJobClient(address, poll_interval_s=0.02)
    _long_running_job(fake, client)
    thread, seen, result = _waited(client, polls=5)
    opened = sum(1 for _, path in fake.requests if path == "/api/v0/logs/stream")
    fake.break_streams.set()
    until(lambda: sum(1 for _, path in fake.requests if path == "/api/v0/logs/stream") > opened)
    steps = (seen[-1].roles[0].actors[0].step or 0) if seen[-1].roles else 0
    until(
        lambda: bool(seen[-1].roles) and (seen[-1].roles[0].actors[0].step or 0) > steps
    )  # training on, seen
    client.stop("demo")
    thread.join(20)
    assert result and result[0].exit_code == 130
    assert [e.message for e in result[0].events] == ["INIT", "RUNNING"]


def test_a_request_reads_the_head_for_its_check_and_the_answer_from_the_end(
    api: tuple[FakeJobsApi, str],
) -> None:
    """`dlu debug`: no whole-log read through the Jobs API; the answer comes from a stream opened
    at the log's end (its last line, and what follows)."""
    fake, address = api
    client = RemoteJobClient(address, poll_interval_s=0.02)
    sid = _long_running_job(fake, client)
    size = fake.log_bytes(sid, -1)[1]
    before = dict(fake.sent_by)
    assert client.debug("demo", "get_step", "worker") == {"demo.worker.0": 7}
    sent = {k: v - before.get(k, 0) for k, v in fake.sent_by.items()}
    assert sent.get("jobs", 0) == 0, sent
    assert sent.get("stream", 0) < size / 10, (sent, size)  # the tail, not the log
    client.stop("demo")


class ChunkedLog:
    """A RayLogApi stand-in whose job log comes in chunks, noting how many were taken."""

    def __init__(self, chunks: list[bytes]) -> None:
        self.chunks = chunks
        self.taken = 0

    def read(self, node_id: str, filename: str, lines: int = -1) -> Iterator[bytes]:
        del node_id, filename, lines
        for chunk in self.chunks:
            self.taken += 1
            yield chunk


def test_the_head_is_read_only_until_the_launcher_accepted() -> None:
    accepted = wire.line(wire.ACCEPTED, {"name": "demo", wire.MAILBOX: True})
    chunks = [b"starting\n" + accepted[:10].encode(), (accepted[10:] + "\n").encode()]
    chunks += [b"DLU-STATUS {}\n" * 1000] * 50
    log: Any = ChunkedLog(chunks)
    report = read_head(log, "node", "job-driver-x.log", lambda r: r.accepted is not None)
    assert report.accepted == {"name": "demo", wire.MAILBOX: True}
    assert log.taken == 2  # the line split across two chunks, nothing after it


def test_a_cluster_without_the_log_api_is_followed_through_the_jobs_api(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with serve(monkeypatch, log_api=False) as (fake, address):
        client = RemoteJobClient(address, poll_interval_s=0.02)
        client.submit(JobSpec.model_validate(SPEC))
        thread, _, result = _waited(client, polls=3)
        client.stop("demo")
        thread.join(20)
        assert result and result[0].exit_code == 130
        assert fake.sent_by.get("stream", 0) == 0 and fake.sent_by.get("jobs", 0) > 0


class EndedLog:
    """A RayLogApi stand-in for a job that ended: its whole log, then a stream with nothing new."""

    def __init__(self, text: bytes) -> None:
        self.text = text

    def read(self, node_id: str, filename: str, lines: int = -1) -> Iterator[bytes]:
        del node_id, filename, lines
        yield self.text

    def follow(self, *_: Any) -> Iterator[bytes]:
        return iter(())


def test_a_followed_timeline_ends_with_a_last_line_that_has_no_newline() -> None:
    log: Any = EndedLog(b"x\n" + wire.line(wire.ACCEPTED, {}).encode() + b"\ny\nTraceback: boom")
    feed = LauncherFeed(log, "node", "job-driver-x.log").open()
    try:
        assert list(follow_human_lines(feed, lambda: True, 0.01)) == ["x", "y", "Traceback: boom"]
    finally:
        feed.close()
