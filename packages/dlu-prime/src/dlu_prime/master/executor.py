"""The executor: runs one command of the decision core through narrow ports (the Scheduler, the
Extension, the clock, and the PrimeManager's few callbacks) and returns its outcome as a `Done`
event. It never decides: what an outcome means is `core.decide`'s.

Every command is idempotent where a PrimeMaster rebuilt half way may run it again: actors are
created or adopted by name, start is idempotent, removal skips what is already gone.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from dlu_prime.extension import Extension
from dlu_prime.master.core.commands import (
    AddActors,
    AdoptResized,
    AskNodeNeeds,
    AskStop,
    CheckNodes,
    Cleanup,
    Command,
    DropActors,
    FindDeadNodes,
    FindDeadPeers,
    FindLostNodes,
    FindPlacedNodes,
    ForgetLiveness,
    KnowActors,
    PlaceActors,
    RecoverSubMasters,
    ReformTraining,
    RelaunchNodes,
    RemoveActors,
    RemoveNodeGroups,
    ReplaceActors,
    ReplacedSeen,
    RequeueShards,
    RunChecks,
    SeeReplaced,
    SetMemory,
    SetSeats,
    StartActors,
    StopActors,
    SubMasterFailover,
    Wake,
)
from dlu_prime.master.core.events import Done
from dlu_prime.master.lifecycle import gone
from dlu_prime.master.resize_plan import SubMasterAway
from dlu_prime.scheduler.base import ActorSetupError, Scheduler

logger = logging.getLogger(__name__)

# A role failover through its SubMaster replaces and sets up actors: minutes on a big node, never
# forever. Past this the failover failed (and escalates to a job restart).
SUB_MASTER_FAILOVER_TIMEOUT_S = 600.0

REBUILD_POLL_S = 0.1  # how often a rebuilt incarnation is looked for (`RunChecks.wait_s`)


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
        except SubMasterAway as exc:
            logger.info("%s waits: %s", type(command).__name__, exc)
            return Done(command, None, exc, self.clock() - started)
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
                # through the set-up incarnation only: a dead one is `SubMasterAway` (it waits)
                return self._call_sub(
                    sub, "failover", list(actors), reason, timeout_s=self.sub_master_timeout_s
                )
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
            case SeeReplaced(names=names, nodes=nodes):
                return self._see_replaced(names, nodes)
            case ForgetLiveness():
                self.callbacks.forget_liveness()
                return None
            case AdoptResized(ranks=ranks):
                for role, (role_ranks, world) in ranks.items():
                    s.know(role, list(role_ranks), world)
                return None
            case SetMemory(memory=memory):
                s.set_memory(dict(memory))
                return None
            case SetSeats(seats=seats):
                s.set_seats(dict(seats))
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
            case _:
                return self._run_resize(command)

    def _run_resize(self, command: Command) -> Any:
        """The steps of a resize and the views its decisions need."""
        s = self.scheduler
        match command:
            case KnowActors(role=role, ranks=ranks, world=world):
                s.know(role, list(ranks), world)
            case AddActors(role=role, ranks=ranks, world=world):
                return s.add_actors(role, list(ranks), world)
            case RemoveActors(names=names):
                s.remove_actors(list(names))
            case DropActors(names=names):
                s.drop_actors(list(names))
            case RemoveNodeGroups(role=role, nodes=nodes):
                s.remove_node_groups(role, list(nodes))
            case RequeueShards(queues=queues, names=names):
                return s.requeue_shards(list(queues), list(names))
            case FindPlacedNodes(role=role, nodes=nodes, wait_s=wait_s):
                return s.placed_nodes(role, list(nodes), wait_s=wait_s)
            case AskNodeNeeds(role=role):
                return s.node_needs(role)
            case FindLostNodes(nodes=nodes):
                return s.dead_nodes(list(nodes))
            case CheckNodes(sub=sub, ranks=ranks, timeout_s=timeout_s):
                return self._call_sub(sub, "check_nodes", list(ranks), timeout_s=timeout_s)
            case ReformTraining(sub=sub, ranks=ranks, added=added, reform_s=reform_s, timeout_s=timeout_s):
                return self._call_sub(
                    sub, "resize_members", list(ranks), list(added), reform_s, timeout_s=timeout_s
                )
            case _:
                raise TypeError(f"not a command: {command!r}")
        return None

    def _call_sub(self, sub: str, method: str, *args: Any, timeout_s: float) -> Any:
        """Call the role's SubMaster, which must be the set-up incarnation: one that is dead, being
        rebuilt by Ray, or rebuilt and not set up yet (it died with the lost node, or on its own)
        raises `SubMasterAway`, before the call or when the call failed because of it."""
        self._sub_ready(sub)
        try:
            return self.scheduler.call(sub, method, *args, timeout_s=timeout_s)
        except ActorSetupError:
            self._sub_ready(sub)
            raise

    def _sub_ready(self, sub: str) -> None:
        seen = self.scheduler.poll([sub]).get(sub)
        if seen is None or gone(seen) or seen.unavailable:
            error = (seen.error if seen is not None else None) or "not answering"
            raise SubMasterAway(f"its SubMaster {sub} is dead or being rebuilt by Ray ({error})")

    def _see_replaced(self, names: tuple[str, ...], nodes: tuple[str, ...]) -> ReplacedSeen:
        """The poll of a saved failover's actors; a gone one carries where it last ran, and the
        nodes asked of Ray are the given ones and those (`failover_chain` tells by them whether
        the dead PrimeMaster had placed a replacement that died since)."""
        s = self.scheduler
        polled = dict(s.poll(list(names)))
        gone_now = [
            n for n, o in polled.items() if o.stage is None and not o.unavailable and o.node_id is None
        ]
        for name, node in (s.last_nodes(gone_now) if gone_now else {}).items():
            if name in polled:
                polled[name] = replace(polled[name], node_id=node)
        ran_on = {o.node_id for o in polled.values() if o.stage is None and o.node_id is not None}
        asked = sorted({*nodes, *ran_on})
        dead = frozenset(s.dead_nodes(asked)) if asked else frozenset[str]()
        return ReplacedSeen(polled, self.extension is not None, dead)

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
        `wait_s` (or it is gone for good). Waited on the clock port (a simulated clock governs
        it), and for at most `wait_s` worth of polls where that clock does not move."""
        deadline = self.clock() + wait_s
        for _ in range(math.ceil(wait_s / REBUILD_POLL_S) + 1):  # the last poll at the deadline
            seen = self.scheduler.poll([name]).get(name)
            if seen is not None and seen.stage is not None:
                return seen.incarnation
            if seen is not None and not seen.unavailable and "no longer exists" in (seen.error or ""):
                return None
            if self.clock() >= deadline:
                return None
            self.sleep(REBUILD_POLL_S)
        return None
