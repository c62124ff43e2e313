"""`dlu debug`'s side of the PrimeMaster: find a role's ranks, read their steps, and mark actors
unhealthy (judged as error reports at the next monitoring pass)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from dlu_prime.master.monitor import Failure
from dlu_prime.master.state import SUB_MASTER_RANK

if TYPE_CHECKING:
    from dlu_prime.master.manager import PrimeManager


class DebugTools:
    def __init__(self, manager: PrimeManager) -> None:
        self._manager = manager

    def worker_names(self, role: str, rank: int | None = None) -> list[str]:
        """A role's workers (or one rank).

        Raises:
            ValueError: no such role or rank.
        """
        manager = self._manager
        with manager.lock:
            state = manager.state
            known = [r.name for r in state.spec.roles]
            if role not in known:
                raise ValueError(f"job {state.job} has no role {role!r}; roles: {', '.join(known)}")
            names = [
                n
                for n, a in sorted(state.actors.items(), key=lambda item: item[1].rank)
                if a.role == role and a.rank != SUB_MASTER_RANK and (rank is None or a.rank == rank)
            ]
        if not names:
            raise ValueError(f"role {role} has no rank {rank}")
        return names

    def mark_unhealthy(self, names: list[str], message: str) -> None:
        """The health seed's mark-unhealthy endpoint: these actors count as having reported an
        error, judged at the next monitoring pass (woken now)."""
        manager = self._manager
        with manager.lock:
            failures = [
                Failure(
                    name,
                    manager.state.actors[name].role,
                    "error_report",
                    message,
                    manager.state.actors[name].node_id,
                )
                for name in names
            ]
        manager.inject(failures)

    def steps(self) -> dict[str, int]:
        """The last training step each running actor reported."""
        return self._manager.steps()
