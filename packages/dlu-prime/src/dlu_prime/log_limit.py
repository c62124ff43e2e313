"""At most one log line per kind of event per interval, each line with the count since the last.

A flood of like events (2,000 calls refused for a bad token) would otherwise be 2,000 lines in
the user's output. The first event of a kind is reported at once; the next ones are counted and
reported together once `interval_s` has passed since that kind's last report: with the next
event, or when the owner asks for what is `due()` (from a timer set for `next_due_at()`), or
`drain()`s what is left when it stops. Pure: time comes from the injected clock, and the owner
writes the lines. Kinds are meant to be a small fixed set (each is remembered).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class Report:
    """What one line says: `count` events of `kind` since its last line, the latest one's detail."""

    kind: str
    count: int
    latest: str
    since_s: float | None  # since the kind's previous report; None for its first


@dataclass
class _Tally:
    pending: int = 0
    latest: str = ""
    reported_at: float | None = None


class LogLimiter:
    def __init__(self, interval_s: float = 10.0, clock: Callable[[], float] = time.monotonic) -> None:
        if interval_s <= 0:
            raise ValueError(f"interval_s must be > 0, got {interval_s}")
        self.interval_s = interval_s
        self._clock = clock
        self._tallies: dict[str, _Tally] = {}

    def record(self, kind: str, detail: str = "") -> Report | None:
        """Count one event; its report when a line is due now (the kind's first, or its first
        after a quiet interval), else None."""
        tally = self._tallies.setdefault(kind, _Tally())
        tally.pending += 1
        tally.latest = detail
        now = self._clock()
        if tally.reported_at is None or now - tally.reported_at >= self.interval_s:
            return self._report(kind, tally, now)
        return None

    def due(self) -> list[Report]:
        """Reports of the kinds with events counted and a full interval since their last line."""
        now = self._clock()
        return [
            self._report(kind, tally, now)
            for kind, tally in self._tallies.items()
            if tally.pending and tally.reported_at is not None and now - tally.reported_at >= self.interval_s
        ]

    def next_due_at(self) -> float | None:
        """When (on the clock) the earliest counted events become due; None when none wait."""
        waiting = [
            tally.reported_at + self.interval_s
            for tally in self._tallies.values()
            if tally.pending and tally.reported_at is not None
        ]
        return min(waiting, default=None)

    def drain(self) -> list[Report]:
        """Reports of every kind with events counted, due or not (at shutdown)."""
        now = self._clock()
        return [self._report(kind, tally, now) for kind, tally in self._tallies.items() if tally.pending]

    def _report(self, kind: str, tally: _Tally, now: float) -> Report:
        since = None if tally.reported_at is None else now - tally.reported_at
        report = Report(kind, tally.pending, tally.latest, since)
        tally.pending, tally.reported_at = 0, now
        return report
