"""How long an in-place restart (tier 1) keeps a role from training: from the failure report
to the moment every rank of the new round has beaten a step it had not beaten before.

Pure bookkeeping on the ElasticMaster's heartbeats, with the time passed in. A rank's agent
keeps beating its last step while its new process starts, so a beat only counts once its step
moved; a rank that never beat before counts at its first beat in the new round.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, field


@dataclass
class _Pending:
    round: int
    started_at: float
    steps_before: dict[str, int]
    waiting: set[str]


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
        if pending.steps_before.get(agent) == step:
            return None  # the agent still shows its old process' last step
        pending.waiting.discard(agent)
        if pending.waiting:
            return None
        self._pending = None
        return now - pending.started_at

    def cancel(self) -> None:
        """Another tier took over (a role failover replaces actors): it is timed there."""
        self._pending = None

    @property
    def timing(self) -> bool:
        return self._pending is not None
