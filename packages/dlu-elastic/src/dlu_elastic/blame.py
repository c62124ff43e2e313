"""Which rank a round's failure is blamed on.

When one training process crashes, its peers' next collective fails too ("Connection closed by
peer" from gloo, a remote error from NCCL) and their reports race the crashed rank's own. The
in-place restart restarts every rank either way, but the event, the count and a stop reason
must name the rank that failed first, not a peer that noticed it. So a report whose error reads
as a peer's loss waits a short grace for a report of the same round that does not; if none comes
(a network fault, or a peer whose actor died: the PrimeMaster's judgement joins that failover)
the peer report is blamed after all.

Pure: `BlameWindow` is fed reports and the time, and says what to act on; the ElasticMaster does
the waiting.
"""

from __future__ import annotations

from dataclasses import dataclass

from dlu_prime.master.causality import is_peer_failure

__all__ = ["PEER_GRACE_S", "Blame", "BlameWindow", "Report", "is_peer_failure"]

PEER_GRACE_S = 2.0


@dataclass(frozen=True)
class Report:
    round: int
    agent: str
    exit_code: int
    error: str
    seen_at: float
    """When it was received (monotonic s): the in-place restart is timed from the first report."""


@dataclass(frozen=True)
class Blame:
    """`act` is the report to restart for now, or None: wait until `recheck_at` (monotonic s)
    and offer nothing new, to blame the held peer report if no better one came."""

    act: Report | None
    recheck_at: float | None = None


class BlameWindow:
    """Holds a peer-looking report of the current round for `grace_s`, preferring any report of
    that round whose error is the rank's own."""

    def __init__(self, grace_s: float = PEER_GRACE_S) -> None:
        self.grace_s = grace_s
        self._held: Report | None = None
        self._held_since = 0.0

    def offer(self, report: Report, now: float) -> Blame:
        """A new report at `now`."""
        if self._held is not None and self._held.round != report.round:
            self._held = None  # a stale round's report: that round was handled
        if not is_peer_failure(report.error):
            self._held = None
            return Blame(report)
        if self._held is None:
            self._held, self._held_since = report, now
        return Blame(None, self._held_since + self.grace_s)

    def expire(self, now: float) -> Report | None:
        """The held report once its grace is over (then forgotten), else None."""
        if self._held is None or now < self._held_since + self.grace_s:
            return None
        held, self._held = self._held, None
        return held

    def forget(self) -> None:
        self._held = None
