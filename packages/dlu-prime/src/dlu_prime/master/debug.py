"""`dlu debug`'s side of the PrimeMaster: find a role's ranks, read their steps, and mark actors
unhealthy (judged as error reports at the next monitoring pass)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from dlu_api.vocabulary import FailureKind
from dlu_prime.master.monitor import Failure
from dlu_prime.master.state import SUB_MASTER_RANK, RequestOutcome, remember_request

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

    def mark_unhealthy(self, names: list[str], message: str, request_id: str | None = None) -> bool:
        """The health seed's mark-unhealthy endpoint: these actors count as having reported an
        error, judged at the next monitoring pass (woken now).

        With `request_id`, at most once: the id is saved before the mark, so a request retried
        after this PrimeMaster was rebuilt is not marked again. Returns whether it was marked now.
        """
        manager = self._manager
        with manager.lock:
            if request_id is not None:
                if request_id in manager.state.requests:
                    return False
                role = manager.state.actors[names[0]].role if names else ""
                outcome = RequestOutcome(action="mark_unhealthy", role=role, actors=names, message=message)
                remember_request(manager.state, request_id, outcome)
                manager.save()
            failures = [
                Failure(
                    name,
                    manager.state.actors[name].role,
                    FailureKind.ERROR_REPORT,
                    message,
                    manager.state.actors[name].node_id,
                )
                for name in names
            ]
        manager.inject(failures)
        return True

    def steps(self) -> dict[str, int]:
        """The last training step each running actor reported."""
        return self._manager.steps()
