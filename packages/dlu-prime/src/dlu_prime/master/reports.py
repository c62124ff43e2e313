"""What SubMasters and ranks' agents report to the PrimeMaster that is only told, never
decided on: their events (node check verdicts, the end of an in-place restart with its
duration) and a checkpoint resumed after a recovery. Saved at once, through the one apply."""

from __future__ import annotations

from collections.abc import Callable

from dlu_api.vocabulary import EventKind, Tier
from dlu_prime.master.changes import Note
from dlu_prime.master.metrics import JobMetrics
from dlu_prime.master.ports import StatePort


class Reports:
    def __init__(self, port: StatePort, metrics: Callable[[], JobMetrics | None]) -> None:
        self._port = port
        self._metrics = metrics  # the Ray metrics, once the PrimeMaster actor set them

    def record_event(
        self,
        kind: str,
        message: str,
        role: str | None = None,
        tier: str | None = None,
        duration_s: float | None = None,
    ) -> None:
        """An event from a SubMaster, on the timeline."""
        self._port.apply(
            Note(EventKind(kind), message, role, tier=Tier(tier) if tier else None, duration_s=duration_s)
        )

    def checkpoint_restored(self, role: str, step: int, source: str, lost_steps: int | None) -> None:
        """A role's ranks resumed checkpoint `step` from `source` after a recovery (reported by
        its rank 0's agent): an event on the timeline (console, `dlu status`) and the lost-steps
        metric."""
        lost = "unknown" if lost_steps is None else str(lost_steps)
        message = f"resumed step {step} from {source}; steps lost: {lost}"
        self._port.apply(Note(EventKind.CHECKPOINT_RESTORED, message, role))
        metrics = self._metrics()
        if metrics is not None and lost_steps:
            metrics.lost_steps(role, lost_steps)
