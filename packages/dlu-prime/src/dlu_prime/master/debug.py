"""`dlu debug`'s side of the PrimeMaster: find a role's ranks, read their steps, and mark actors
unhealthy (judged as error reports at the next monitoring pass)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from dlu_api.vocabulary import FailureKind
from dlu_prime.master.monitor import Failure
from dlu_prime.master.ports import StatePort
from dlu_prime.master.state import MARK_ACTION, SUB_MASTER_RANK, JobState, RequestOutcome, remember_request


class DebugTools:
    def __init__(
        self,
        port: StatePort,
        inject: Callable[[Sequence[Failure]], None],
        steps: Callable[[], dict[str, int]],
    ) -> None:
        self._port = port
        self._inject = inject
        self._steps = steps

    def worker_names(self, role: str, rank: int | None = None) -> list[str]:
        """A role's workers (or one rank).

        Raises:
            ValueError: no such role or rank.
        """
        with self._port.lock:
            state = self._port.state()
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

        With `request_id`, at most once: the id is saved with the mark (pending until a pass
        judged it), so a request retried after this PrimeMaster was rebuilt is not marked again,
        and a rebuilt one judges a mark the dead one had not (`reinject_pending`). Returns
        whether it was marked now.
        """
        with self._port.lock:
            state = self._port.state()
            if request_id is not None:
                if request_id in state.requests:
                    return False
                role = state.actors[names[0]].role if names else ""
                outcome = RequestOutcome(
                    action=MARK_ACTION, role=role, actors=names, message=message, pending=True
                )
                remember_request(state, request_id, outcome)
                self._port.save()
            failures = _marked(state, names, message)
        self._inject(failures)
        return True

    def reinject_pending(self) -> None:
        """A rebuilt PrimeMaster: the marks saved but not judged by the dead one's pass are
        judged at the next pass (each once: the pass that judges it clears `pending`)."""
        with self._port.lock:
            state = self._port.state()
            failures = [
                failure
                for outcome in state.requests.values()
                if outcome.action == MARK_ACTION and outcome.pending
                for failure in _marked(
                    state, [n for n in outcome.actors if n in state.actors], outcome.message
                )
            ]
        if failures:
            self._inject(failures)

    def steps(self) -> dict[str, int]:
        """The last training step each running actor reported."""
        return self._steps()


def _marked(state: JobState, names: list[str], message: str) -> list[Failure]:
    """The error reports a mark stands for, one per actor."""
    return [
        Failure(name, state.actors[name].role, FailureKind.ERROR_REPORT, message, state.actors[name].node_id)
        for name in names
    ]
