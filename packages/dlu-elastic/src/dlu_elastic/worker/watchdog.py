"""A rank's agent watches its own training process: silence and hangs, judged on its clock.

The agent is the one that can tell a hung process from a busy one (it sees every beat the
process sends) and the one that can act at once: it kills the process and reports the failure
as its own, so the in-place restart is blamed on this rank, not on the peers whose collectives
then fail. Only what the process reports is judged: a script that never calls `heartbeat()` is
never found silent, and one that reports no step never hangs.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class ProcessWatch:
    """What one training process has shown of its liveness; `verdict` is a pure judgement."""

    heartbeat_timeout_s: float | None
    hang_timeout_s: float | None
    last_beat_at: float | None = None
    step: int | None = None
    step_moved_at: float | None = None

    def beat(self, step: int | None, now: float) -> None:
        self.last_beat_at = now
        if step is not None and step != self.step:
            self.step = step
            self.step_moved_at = now

    def verdict(self, now: float) -> str | None:
        """Why the process counts as hung now, or None while it is fine."""
        if self.last_beat_at is None:
            return None
        timeout = self.heartbeat_timeout_s
        if timeout is not None and now - self.last_beat_at > timeout:
            return f"training process sent no heartbeat for {now - self.last_beat_at:.1f}s (timeout {timeout:g}s)"
        hang = self.hang_timeout_s
        if hang is not None and self.step_moved_at is not None and now - self.step_moved_at > hang:
            return f"training step stuck at {self.step} for {now - self.step_moved_at:.1f}s (hang timeout {hang:g}s)"
        return None
