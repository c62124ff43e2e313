"""How long an in-place restart (tier 1) keeps a role from training: from the failure report
to the moment every rank of the new round trains again.

Pure bookkeeping on the ElasticMaster's heartbeats, with the time passed in. A rank's agent
keeps beating its last step while its new process starts, so a beat only counts once its step
moved; a rank that never beat before counts at its first beat in the new round.

A script that never calls `heartbeat()` (an unmodified torchrun script) shows step 0 forever:
its rank counts as training again once its new process has been running `ALIVE_S` (its agent
beats the new round only after starting it, and a process that dies sooner reports a failure,
which opens the next round and restarts the clock). Its time is then taken at the new round's
first beat, when the process started, not `ALIVE_S` later.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, field

# How long a new process of a script that never beats must stay up to count as training again:
# several beats (MIN_HEARTBEAT_INTERVAL_S is 0.5 s), long past a crash at import or set-up.
ALIVE_S = 2.0


@dataclass
class _Pending:
    round: int
    started_at: float
    steps_before: dict[str, int]
    waiting: set[str]
    first_beat: dict[str, float] = field(default_factory=dict[str, float])
    trained_at: float = 0.0


@dataclass
class InPlaceTimer:
    steps: dict[str, int] = field(default_factory=dict[str, int])
    """Each agent's last beaten step."""
    _pending: _Pending | None = None

    def restarted(self, new_round: int, now: float, ranks: Collection[str]) -> None:
        """Training restarts in place as `new_round`, with these agents; a restart that was
        still being timed is dropped (the next failure came first: its time is the new one's)."""
        before = {a: s for a, s in self.steps.items() if a in ranks}
        self._pending = _Pending(new_round, now, before, set(ranks))

    def beat(self, agent: str, round_: int, step: int, now: float) -> float | None:
        """Note a heartbeat; the restart's duration once its last rank trained again, else None."""
        pending = self._pending
        self.steps[agent] = step
        if pending is None or round_ < pending.round or agent not in pending.waiting:
            return None
        trained_at = now
        if pending.steps_before.get(agent) == step:
            if step != 0:
                return None  # the agent still shows its old process' last step
            # no step ever: a script that never beats; its process is up since its first beat
            first = pending.first_beat.setdefault(agent, now)
            if now - first < ALIVE_S:
                return None
            trained_at = first
        pending.waiting.discard(agent)
        pending.trained_at = max(pending.trained_at, trained_at)
        if pending.waiting:
            return None
        self._pending = None
        return pending.trained_at - pending.started_at

    def cancel(self) -> None:
        """Another tier took over (a role failover replaces actors): it is timed there."""
        self._pending = None

    @property
    def timing(self) -> bool:
        return self._pending is not None
