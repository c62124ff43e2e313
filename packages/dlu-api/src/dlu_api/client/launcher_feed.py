"""A remote job's launcher log, followed: each byte is read once, however long the job runs.

The Jobs API returns a job's whole log on every request, and a remote driver that polled it
(`dlu run`, `dlu wait`, `dlu events -f`, the answer to `dlu stop`) read the log again every
poll: 20 MB a poll for a day of a 4-rank job, 140 MB after a week. A `LauncherFeed` reads the
log once through Ray's dashboard log API (`/api/v0/logs/file`: the file `job-driver-<id>.log` on
the job's `driver_node_id`), then keeps a stream of what the launcher appends
(`/api/v0/logs/stream`) and parses lines as they come (`wire.LogParser`). A stream that breaks
while the job runs is opened again, skipping what was read. Where the cluster has no log API,
`open` raises and the caller reads the whole log.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx

from dlu_api.client import remote_status, wire
from dlu_api.client.ray_logs import STREAM_INTERVAL_S, RayLogApi, job_driver_log
from dlu_api.errors import ClusterError
from dlu_api.rank_logs import LineSplitter
from dlu_api.status import JobStatus

logger = logging.getLogger(__name__)

REOPEN_TAIL_LINES = 1000  # a tail feed's stream opened again: lines written meanwhile are in it
FINAL_STATUS_WAIT_S = 3.0  # a launcher's final status on its way through the stream


class LauncherFeed:
    """The wire lines of one Ray job's driver log, parsed as they are appended.

    `tail_lines=None`: the whole log (statuses, the whole timeline, human lines). A number: only
    what follows the last `tail_lines` lines at the time the feed opened, for a caller that
    waits for something new (a request's answer) and must not read a long log to find it.
    """

    def __init__(self, api: RayLogApi, node_id: str, filename: str, tail_lines: int | None = None) -> None:
        self.api = api
        self.node_id = node_id
        self.filename = filename
        self.tail_lines = tail_lines
        self._parser = wire.LogParser()
        self._split = LineSplitter()
        self._changed = threading.Condition()
        self._received = 0  # bytes of the log taken in (the whole-log feed skips them on a reopen)
        self._last_data = time.monotonic()
        self._stop = threading.Event()
        self._response: httpx.Response | None = None
        self._thread: threading.Thread | None = None

    def open(self) -> LauncherFeed:
        """Read the log so far (a whole-log feed), then follow it in a thread.

        Raises:
            ClusterError: the cluster serves no log API for this job (the caller falls back on
                the Jobs API), or the connection failed.
        """
        try:
            if self.tail_lines is None:
                for chunk in self.api.read(self.node_id, self.filename):
                    self._take(chunk)
            else:  # refused at once where the cluster has no log API
                for _ in self.api.read(self.node_id, self.filename, lines=1):
                    pass
        except httpx.HTTPError as exc:
            raise ClusterError(f"cannot read {self.filename}: {exc}") from exc
        self._thread = threading.Thread(target=self._pump, name="dlu-launcher-feed", daemon=True)
        self._thread.start()
        return self

    def report(self) -> wire.LauncherReport:
        with self._changed:
            return self._parser.report()

    def wait_for(
        self, found: Callable[[wire.LauncherReport], bool], timeout_s: float
    ) -> wire.LauncherReport | None:
        """The report once `found(report)` holds; None if it did not within `timeout_s`."""
        deadline = time.monotonic() + timeout_s
        with self._changed:
            while True:
                report = self._parser.report()
                if found(report):
                    return report
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                self._changed.wait(min(left, 1.0))

    def settle(self, quiet_s: float = 4 * STREAM_INTERVAL_S, at_most_s: float = 10.0) -> wire.LauncherReport:
        """For a job that ended: the report once nothing came for `quiet_s` (lines on their way),
        waiting `at_most_s` at most; a last line without its newline counts (a traceback)."""
        deadline = time.monotonic() + at_most_s
        while time.monotonic() < deadline:
            with self._changed:
                idle = time.monotonic() - self._last_data
            if idle >= quiet_s:
                break
            time.sleep(min(quiet_s - idle, max(0.0, deadline - time.monotonic())) + 0.01)
        with self._changed:
            self._parser.feed(self._split.flush())
            return self._parser.report()

    def close(self) -> None:
        self._stop.set()
        response = self._response
        if response is not None:
            try:
                response.close()  # ends a read waiting for more bytes
            except Exception as exc:  # the stream is being torn down in its thread too
                logger.debug("closing the stream of %s: %s", self.filename, exc)
        if self._thread is not None:
            self._thread.join(5)

    # the stream --------------------------------------------------------------------------------
    def _take(self, chunk: bytes) -> None:
        lines = self._split.feed(chunk)
        with self._changed:
            self._received += len(chunk)
            self._last_data = time.monotonic()
            if lines:
                self._parser.feed(lines)
                self._changed.notify_all()

    def _opened(self, response: httpx.Response) -> None:
        self._response = response
        if self._stop.is_set():
            response.close()

    def _pump(self) -> None:
        whole = self.tail_lines is None
        lines = -1 if whole else self.tail_lines or 1
        while not self._stop.is_set():
            skip = self._received if whole else 0
            try:
                for chunk in self.api.follow(
                    self.node_id, self.filename, skip, self._stop, lines, self._opened
                ):
                    self._take(chunk)
            except (ClusterError, httpx.HTTPError, RuntimeError) as exc:
                if not self._stop.is_set():
                    logger.debug("the stream of %s broke: %s", self.filename, exc)
            if not whole:
                lines = REOPEN_TAIL_LINES
            self._stop.wait(STREAM_INTERVAL_S)  # ended while the job runs (agent restart): reopen


def driver_log(submission_id: str, info: dict[str, Any]) -> tuple[str, str] | None:
    """(node id, file name) of the launcher's log, from its Ray job's record `info`; None before
    the job server started its entrypoint (no driver node yet)."""
    node = info.get("driver_node_id")
    return (str(node), job_driver_log(submission_id)) if node else None


def open_feed(
    api: RayLogApi, submission_id: str, info: dict[str, Any], tail_lines: int | None = None
) -> LauncherFeed | None:
    """A feed of the log of Ray job `submission_id` (its record: `info`), or None where none can
    be had (the job has not started, or the cluster serves no log API)."""
    where = driver_log(submission_id, info)
    if where is None:
        return None
    try:
        return LauncherFeed(api, *where, tail_lines=tail_lines).open()
    except ClusterError as exc:
        logger.debug("no stream of %s (%s): the whole log is read instead", where[1], exc)
        return None


def read_head(
    api: RayLogApi, node_id: str, filename: str, found: Callable[[wire.LauncherReport], bool]
) -> wire.LauncherReport:
    """The log read from its start until `found(report)` holds (or to its end): what a launcher
    writes first (DLU-ACCEPTED, or why it refused) without reading a long log.

    Raises:
        ClusterError: the cluster serves no log API for it.
    """
    parser = wire.LogParser()
    split = LineSplitter()
    try:
        for chunk in api.read(node_id, filename):
            lines = split.feed(chunk)
            if lines:
                parser.feed(lines)
                if found(parser.report()):
                    break
        else:
            parser.feed(split.flush())
    except httpx.HTTPError as exc:
        raise ClusterError(f"cannot read {filename}: {exc}") from exc
    return parser.report()


def launcher_accepted(
    api: RayLogApi, submission_id: str, info: dict[str, Any], whole_log: Callable[[], str]
) -> dict[str, Any] | None:
    """The launcher's DLU-ACCEPTED, read from the head of its log; `whole_log()` (the Jobs API)
    where the cluster serves no log API."""
    where = driver_log(submission_id, info)
    if where is not None:
        try:
            return read_head(api, *where, lambda r: r.accepted is not None).accepted
        except ClusterError as exc:
            logger.debug("reading the head of %s: %s", where[1], exc)
    return wire.parse_log(whole_log()).accepted


def followed_status(
    name: str, address: str, info: dict[str, Any], feed: LauncherFeed | None, whole_log: Callable[[], str]
) -> JobStatus:
    """The job's status from its Ray job record `info` and its feed (`whole_log()`, the Jobs
    API, without one)."""
    if feed is None:
        return remote_status.status_from(name, address, info, whole_log())
    if str(info.get("status")) not in remote_status.TERMINAL:
        return remote_status.status_from(name, address, info, feed.report())
    # The launcher wrote its final status before it exited; the stream brings it within an
    # interval. Without it (the stream broke, the launcher was killed): the whole log.
    report = feed.wait_for(lambda r: r.status is not None and r.status.finished, FINAL_STATUS_WAIT_S)
    return remote_status.status_from(name, address, info, whole_log() if report is None else report)


def follow_human_lines(feed: LauncherFeed, finished: Callable[[], bool], poll_s: float) -> Iterator[str]:
    """The launcher's human lines (wire lines left out) as they come, until `finished()`, then
    the rest."""
    seen = 0
    while True:
        done = finished()
        report = feed.settle() if done else feed.report()
        lines = report.other_lines[seen:]
        seen += len(lines)
        yield from (line for line in lines if not wire.is_wire_line(line))
        if done:
            return
        time.sleep(poll_s)
