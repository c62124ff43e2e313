"""Which `DLU-STATUS` lines the cluster launcher writes into its Ray job's log, from which a
remote `dlu run` draws its console (dlu_api.client.wire).

Every stage change and the end carry the whole timeline, as a remote `dlu status` of a stopped
job reads it. Between them, the console needs the roles' steps and the events as they happen:
at most one line every `every_s` seconds when anything changed, holding only the events since
the previous line, so that the log grows with what happened rather than with a timeline
repeated every few seconds. The driver puts the timeline back together (`wire.parse_log`).
"""

from __future__ import annotations

from dlu_api.client import wire
from dlu_api.status import EventCursor, JobEvent, JobStatus

PROGRESS_EVERY_S = 2.0


class StatusLines:
    def __init__(self, every_s: float = PROGRESS_EVERY_S) -> None:
        self._every_s = every_s
        self._stage: str | None = None
        self._written_at: float | None = None
        self._last: JobStatus | None = None  # the last status written, without its events
        self._cursor = EventCursor()
        self._pending: list[JobEvent] = []  # events not written yet

    def line(self, status: JobStatus, now: float) -> str | None:
        """The line to write for `status` (seen at `now`, seconds on any steady clock), if any."""
        self._pending += self._cursor.take(status.events)
        bare = status.model_copy(update={"events": []})
        if status.stage.value != self._stage or status.finished:
            self._stage = status.stage.value
            return self._written(bare, now, wire.status_line(status))
        due = self._written_at is None or now - self._written_at >= self._every_s
        if not due or (bare == self._last and not self._pending):
            return None
        return self._written(bare, now, wire.status_line(status.model_copy(update={"events": self._pending})))

    def _written(self, bare: JobStatus, now: float, text: str) -> str:
        self._last, self._written_at, self._pending = bare, now, []
        return text
