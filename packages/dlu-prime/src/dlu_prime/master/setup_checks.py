"""The checks before a job (or a job-level restart) runs: every actor's self check, then the
SubMasters' checks (e.g. the node check). An actor that dies under them and that Ray rebuilds
is checked again, once per death, on its role's budget; which process answers tells one death
from the next (calls that fail while Ray still rebuilds it are the same death)."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from dlu_prime.master.changes import SetupRetried
from dlu_prime.master.failover import setup_retry
from dlu_prime.master.lifecycle import RestartLimitError, sub_masters
from dlu_prime.scheduler.base import ActorSetupError

if TYPE_CHECKING:
    from dlu_prime.master.manager import PrimeManager


class SetupChecks:
    def __init__(self, manager: PrimeManager) -> None:
        self._manager = manager

    def run(self, names: list[str]) -> None:
        """Raises:
        ActorSetupError: a check failed.
        RestartLimitError: an actor kept dying and its role's budget is used up."""
        m = self._manager
        pending = names
        counted: dict[str, str | None] = {}  # actor -> the incarnation its last counted death gave
        while True:
            try:
                if pending:
                    m.scheduler.setup(pending)
                m.scheduler.check_children(sub_masters(m.state))
                return
            except ActorSetupError as exc:
                if not exc.transient or exc.actor not in m.state.actors:
                    raise
                incarnation = self._await_incarnation(exc.actor)
                if exc.actor in counted and incarnation is not None and counted[exc.actor] == incarnation:
                    # The same process answers: the call failed while Ray was still rebuilding it
                    # (or on a blip), not because it died again. Not another fault.
                    pending = [exc.actor]
                    continue
                recovery, stop = setup_retry(m.state, exc.actor, exc.error)
                if recovery is None:
                    raise RestartLimitError(stop or exc.error) from None
                m.apply(SetupRetried(recovery))
                counted[exc.actor] = incarnation
                pending = [exc.actor]

    def _await_incarnation(self, name: str) -> str | None:
        """Which process of `name` answers once Ray has rebuilt it; None if none answers within
        the heartbeat timeout (or it is gone for good)."""
        m = self._manager
        deadline = time.monotonic() + m.state.spec.health.heartbeat_timeout_s
        while True:
            seen = m.scheduler.poll([name]).get(name)
            if seen is not None and seen.stage is not None:
                return seen.incarnation
            if seen is not None and not seen.unavailable and "no longer exists" in (seen.error or ""):
                return None
            if time.monotonic() >= deadline:
                return None
            time.sleep(0.1)
