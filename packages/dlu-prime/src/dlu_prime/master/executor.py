"""The executor: runs one command of the decision core through narrow ports (the Scheduler, the
Extension, the clock, and the PrimeManager's few callbacks) and returns its outcome as a `Done`
event. It never decides: what an outcome means is `core.decide`'s.

Every command is idempotent where a PrimeMaster rebuilt half way may run it again: actors are
created or adopted by name, start is idempotent, removal skips what is already gone.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from dlu_prime.extension import Extension
from dlu_prime.master.core.commands import (
    AdoptResized,
    AskStop,
    Cleanup,
    Command,
    FindDeadNodes,
    FindDeadPeers,
    ForgetLiveness,
    PlaceActors,
    RecoverSubMasters,
    RelaunchNodes,
    ReplaceActors,
    RunChecks,
    StartActors,
    StopActors,
    SubMasterFailover,
    Wake,
)
from dlu_prime.master.core.events import Done
from dlu_prime.master.lifecycle import gone
from dlu_prime.scheduler.base import ActorSetupError, Scheduler

logger = logging.getLogger(__name__)

# A role failover through its SubMaster replaces and sets up actors: minutes on a big node, never
# forever. Past this the failover failed (and escalates to a job restart).
SUB_MASTER_FAILOVER_TIMEOUT_S = 600.0


@dataclass
class Callbacks:
    """What the executor may ask of the PrimeManager: nothing that changes the state."""

    forget_liveness: Callable[[], None]
    ask_stop: Callable[[str, bool], None]
    wake: Callable[[], None]
    sub_masters: Callable[[], list[str]]  # the SubMasters whose checks follow the self checks


class Executor:
    def __init__(
        self,
        scheduler: Scheduler,
        callbacks: Callbacks,
        extension: Extension | None = None,
        clock: Callable[[], float] = time.time,
        sub_master_timeout_s: float = SUB_MASTER_FAILOVER_TIMEOUT_S,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.scheduler = scheduler
        self.callbacks = callbacks
        self.extension = extension
        self.clock = clock
        self.sub_master_timeout_s = sub_master_timeout_s
        self.sleep = sleep

    def run(self, command: Command) -> Done:
        """Run `command`; any error it raises is its outcome (never raised here)."""
        started = self.clock()
        try:
            value = self._run(command)
        except ActorSetupError as exc:
            # Which process answers once Ray has rebuilt it (the core tells one death from the next).
            wait = command.wait_s if isinstance(command, RunChecks) else 0.0
            incarnation = self._await_incarnation(exc.actor, wait) if exc.transient and wait else None
            return Done(command, incarnation, exc, self.clock() - started)
        except Exception as exc:
            logger.warning(
                "%s failed: %s: %s", type(command).__name__, type(exc).__name__, exc, exc_info=True
            )
            return Done(command, None, exc, self.clock() - started)
        return Done(command, value, None, self.clock() - started)

    def _run(self, command: Command) -> Any:
        s = self.scheduler
        match command:
            case PlaceActors():
                return s.prepare()
            case RunChecks(names=names):
                if names:
                    s.setup(list(names))
                s.check_children(self.callbacks.sub_masters())
                return None
            case ReplaceActors(names=names):
                return s.restart(list(names))
            case StartActors(names=names):
                if names:
                    s.start(list(names))
                return None
            case SubMasterFailover(sub=sub, actors=actors, reason=reason):
                return s.call(sub, "failover", list(actors), reason, timeout_s=self.sub_master_timeout_s)
            case RecoverSubMasters(names=names):
                for name in names:
                    s.call(name, "recover_running")
                return None
            case RelaunchNodes(nodes=nodes):
                if self.extension is None:
                    raise RuntimeError("no extension is configured to relaunch nodes")
                return self.extension.relaunch_nodes_impl(list(nodes))
            case FindDeadNodes(nodes=nodes):
                return s.dead_nodes(list(nodes)) if nodes else set[str]()
            case FindDeadPeers(peers=peers):
                return self._dead_peers(peers)
            case ForgetLiveness():
                self.callbacks.forget_liveness()
                return None
            case AdoptResized(ranks=ranks):
                for role, (role_ranks, world) in ranks.items():
                    s.know(role, list(role_ranks), world)
                return None
            case StopActors(names=names):
                s.stop(list(names))
                return None
            case Cleanup():
                s.cleanup()
                return None
            case AskStop(reason=reason, failed=failed):
                self.callbacks.ask_stop(reason, failed)
                return None
            case Wake():
                self.callbacks.wake()
                return None

    def _dead_peers(self, peers: dict[str, str | None] | Any) -> list[str]:
        """Peers on a node Ray marks dead are dead: asking them would wait out the poll timeout
        (Ray cannot place them again) while the rank's agent waits for this answer."""
        nodes = [node for node in peers.values() if node is not None]
        down = self.scheduler.dead_nodes(nodes) if nodes else set[str]()
        dead = [n for n, node in peers.items() if node in down]
        alive = [n for n in peers if n not in dead]
        dead += [n for n, seen in self.scheduler.poll(alive).items() if gone(seen)] if alive else []
        return dead

    def _await_incarnation(self, name: str, wait_s: float) -> str | None:
        """Which process of `name` answers once Ray has rebuilt it; None if none answers within
        `wait_s` (or it is gone for good)."""
        deadline = time.monotonic() + wait_s
        while True:
            seen = self.scheduler.poll([name]).get(name)
            if seen is not None and seen.stage is not None:
                return seen.incarnation
            if seen is not None and not seen.unavailable and "no longer exists" in (seen.error or ""):
                return None
            if time.monotonic() >= deadline:
                return None
            self.sleep(0.1)
