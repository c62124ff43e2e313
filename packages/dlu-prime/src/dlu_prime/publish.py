"""What a cluster job's launcher keeps telling a remote driver through its Ray job log.

A remote `dlu status` reads the launcher's log (no Ray job per call), so the launcher writes
each event once as it happens (`DLU-EVENT`) and the job's status (`DLU-STATUS`, without
events) whenever it changes: at once when anything but the ranks' steps changed (a stage, an
actor's state, a restart), else at most every `DLU_STATUS_INTERVAL_S` seconds (default 5), so
a long run's log grows by one short line per interval, not per poll.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable

from dlu_api.client import wire
from dlu_api.status import EventCursor, JobStatus

STATUS_INTERVAL_ENV = "DLU_STATUS_INTERVAL_S"
DEFAULT_STATUS_INTERVAL_S = 5.0


def status_interval_s() -> float:
    """The interval from the environment; a value that is not a positive number is refused."""
    raw = os.environ.get(STATUS_INTERVAL_ENV, "")
    if not raw:
        return DEFAULT_STATUS_INTERVAL_S
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if value <= 0:
        raise ValueError(
            f"{STATUS_INTERVAL_ENV}={raw!r} is not allowed: give a number of seconds > 0, e.g. 5"
        )
    return value


def without_events(status: JobStatus) -> JobStatus:
    return status.model_copy(update={"events": []})


def shape(status: JobStatus) -> JobStatus:
    """The status without what changes with training progress alone (events, steps)."""
    roles = [
        role.model_copy(update={"actors": [a.model_copy(update={"step": None}) for a in role.actors]})
        for role in status.roles
    ]
    return status.model_copy(update={"events": [], "roles": roles})


def due(last: JobStatus | None, last_time: float, current: JobStatus, now: float, interval_s: float) -> bool:
    """Whether `current` is to be published, `last` having been published at `last_time`."""
    if last is None or shape(current) != shape(last):
        return True
    return without_events(current) != without_events(last) and now - last_time >= interval_s


class StatusPublisher:
    """Called with every changed status of the job; writes the wire lines `due` asks for."""

    def __init__(
        self,
        emit: Callable[[str], None],
        interval_s: float = DEFAULT_STATUS_INTERVAL_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._emit = emit
        self._interval = interval_s
        self._clock = clock
        self._cursor = EventCursor()
        self._last: JobStatus | None = None
        self._last_time = 0.0

    def __call__(self, status: JobStatus) -> None:
        for event in self._cursor.take(status.events):
            self._emit(wire.event_line(event))
        now = self._clock()
        if due(self._last, self._last_time, status, now, self._interval):
            self._emit(wire.status_line(without_events(status)))
            self._last, self._last_time = status, now

    def final(self, status: JobStatus) -> None:
        """The job's end: its last events, then its status with its (bounded) timeline, which
        a driver that reads no DLU-EVENT lines takes as the job's events."""
        for event in self._cursor.take(status.events):
            self._emit(wire.event_line(event))
        self._emit(wire.status_line(status))
