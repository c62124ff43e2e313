"""Rendezvous rounds and rank assignment, free of gRPC and Ray so it is unit-testable with a fake
clock and cheap enough for thousands of agents (O(1) per join and per poll, one sort per round).

Decisions (DESIGN section 3, torchrun's dynamic rendezvous where this file is silent):

- A *member* is an agent (one per node group), identified by `agent_id`. Rounds are numbered
  from 1, so a request that forgot its round (proto3 default 0) is refused as stale.
- A round completes when `max_nodes` agents joined, or when at least `min_nodes` joined and
  `grace_s` passed since the round first reached `min_nodes` (torchrun's last call), or when at
  least `min_nodes` joined and every agent the round *expects* joined. A round started by a
  membership change expects the members of the round before it, so a restart or a scale-up
  completes as soon as everybody is back instead of always paying the grace period.
- Ranks are node-major and deterministic (`assignment.assign`): agents sorted by (has no hint,
  node_rank_hint, node_id, agent_id) get group ranks 0..n-1; an agent's rank offset is the sum
  of `local_ranks` of the agents before it; the world size is the sum of all `local_ranks`.
- The torch master is group rank 0: its `host` and the `free_port` it reserved.
- After completion the round is frozen. Joining again with the same description is a no-op
  (retries are safe); a new agent, or a member joining with a changed description (a restarted
  agent), is a membership change and starts the next round. A new agent that finds the complete
  round full (`max_nodes`) is not a change: it is parked as a spare, refused (`accepted` false)
  and counted in `waiting`, as torchrun does; spares join again and get into the next round.
- The master drives the rest: `leave` (an agent is gone) and `new_round` (restart training)
  start the next round, which expects the surviving members.

The refusals (`StaleRoundError`, ...) and the id check are in state_errors.py.

Thread-safe: the gRPC server calls in from its event loop and worker threads, the master from
its own thread. Waiters that cannot block a thread (the gRPC server's long polls) register a
listener: it is called, under the lock, whenever a round completes or a new round starts, and
must only hand the news on (for example `loop.call_soon_threadsafe`). Completion by the grace
period is noticed when someone looks: call `refresh()` now and then while anyone waits.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Literal

from dlu_elastic.rendezvous.assignment import MAX_LOCAL_RANKS, AgentInfo, Assignment, Placement, assign
from dlu_elastic.rendezvous.state_errors import (
    MAX_ID_LENGTH,
    InvalidRequestError,
    NotMemberError,
    RendezvousStateError,
    StaleRoundError,
    check_id,
)

log = logging.getLogger(__name__)

# Re-exported: the gRPC layer, the master and the tests import these from here.
__all__ = [
    "MAX_ID_LENGTH",
    "MAX_LOCAL_RANKS",
    "AgentInfo",
    "AgentView",
    "Assignment",
    "InvalidRequestError",
    "JoinResult",
    "NotMemberError",
    "Placement",
    "Rendezvous",
    "RendezvousRound",
    "RendezvousSnapshot",
    "RendezvousStateError",
    "StaleRoundError",
    "assign",
    "check_id",
]

_RECHECK_S = 0.05  # wait_complete re-evaluates the grace period at least this often


@dataclass(frozen=True, slots=True)
class JoinResult:
    round: int
    accepted: bool


@dataclass(frozen=True, slots=True)
class AgentView:
    """What one agent learns when it polls its round; `placement` is set once complete."""

    round: int
    joined: int
    waiting: int
    placement: Placement | None
    assignment: Assignment | None

    @property
    def complete(self) -> bool:
        return self.assignment is not None


@dataclass(frozen=True, slots=True)
class RendezvousSnapshot:
    """The master's view of the current round."""

    round: int
    joined: tuple[str, ...]
    expected: frozenset[str]
    spares: tuple[str, ...]
    assignment: Assignment | None

    @property
    def complete(self) -> bool:
        return self.assignment is not None


@dataclass
class RendezvousRound:
    """One round while it fills up; frozen once `assignment` is set."""

    number: int
    expected: frozenset[str] = frozenset()
    joined: dict[str, AgentInfo] = field(default_factory=dict)
    min_reached_at: float | None = None
    assignment: Assignment | None = None


class Rendezvous:
    """The rounds of one elastic role. `clock` is monotonic seconds (injectable for tests).

    `grace_s` only matters when min_nodes < max_nodes; its default is torchrun's last-call
    timeout. With 0 a round completes the moment `min_nodes` joined, even a restart round whose
    other members are on their way back.
    """

    def __init__(
        self,
        min_nodes: int,
        max_nodes: int,
        grace_s: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not 1 <= min_nodes <= max_nodes:
            raise ValueError(
                f"need 1 <= min_nodes <= max_nodes, got min_nodes={min_nodes} max_nodes={max_nodes}"
            )
        if grace_s < 0:
            raise ValueError(f"grace_s must be >= 0, got {grace_s}")
        self.min_nodes = min_nodes
        self.max_nodes = max_nodes
        self.grace_s = grace_s
        self._clock = clock
        self._cond = threading.Condition()
        self._round = RendezvousRound(number=1)
        self._spares: dict[str, AgentInfo] = {}
        self._listeners: list[Callable[[], None]] = []

    def add_listener(self, listener: Callable[[], None]) -> Callable[[], None]:
        """Call `listener()` (under the lock: it must be quick and must not call back into this
        object) whenever a round completes or the next round starts. Returns the remover."""
        with self._cond:
            self._listeners.append(listener)

        def remove() -> None:
            with self._cond:
                if listener in self._listeners:
                    self._listeners.remove(listener)

        return remove

    def refresh(self) -> None:
        """Complete the current round if its grace period has run out (listeners hear of it)."""
        with self._cond:
            self._advance(self._clock())

    @property
    def round(self) -> int:
        with self._cond:
            return self._round.number

    def join(self, agent: AgentInfo) -> JoinResult:
        """Add an agent to the current round, or start the next one on a membership change."""
        with self._cond:
            now = self._clock()
            self._advance(now)
            current = self._round
            if current.assignment is None:
                current.joined[agent.agent_id] = agent  # an open round takes updates as they come
                self._spares.pop(agent.agent_id, None)
                self._advance(now)
                return JoinResult(current.number, True)
            known = current.joined.get(agent.agent_id)
            if known == agent:
                return JoinResult(current.number, True)
            if known is None and len(current.joined) >= self.max_nodes:
                self._spares[agent.agent_id] = agent
                return JoinResult(current.number, False)
            self._start_round(frozenset(current.joined) | {agent.agent_id})
            self._round.joined[agent.agent_id] = agent
            self._spares.pop(agent.agent_id, None)
            self._advance(now)
            return JoinResult(self._round.number, True)

    def view(self, agent_id: str, round_: int) -> AgentView:
        """What `agent_id` knows about `round_`, which must be the current round and joined."""
        with self._cond:
            self._advance(self._clock())
            current = self._require_member(agent_id, round_)
            assignment = current.assignment
            return AgentView(
                round=current.number,
                joined=len(current.joined),
                waiting=len(self._spares),
                placement=None if assignment is None else assignment.by_agent[agent_id],
                assignment=assignment,
            )

    def settled(self, agent_id: str, round_: int) -> AgentView | Literal[False] | None:
        """What a held call waits for: `agent_id`'s view once `round_` is complete; False once it
        never can be (superseded, or the agent is no longer a member: it must join again); None
        while pending. Refuses nothing and builds no view while pending: every held call asks at
        least twice, thousands at once."""
        with self._cond:
            self._advance(self._clock())
            current = self._round
            if current.number != round_ or agent_id not in current.joined:
                return False
            assignment = current.assignment
            if assignment is None:
                return None
            return AgentView(
                round=current.number,
                joined=len(current.joined),
                waiting=len(self._spares),
                placement=assignment.by_agent[agent_id],
                assignment=assignment,
            )

    def require_member(self, agent_id: str, round_: int) -> None:
        """Refuse per-round reports from another round or from an agent that did not join it."""
        with self._cond:
            self._require_member(agent_id, round_)

    def leave(self, agent_id: str) -> int:
        """An agent is gone. Leaving an open round shrinks it (and its expectations); leaving a
        complete one is a membership change. Returns the current round afterwards."""
        with self._cond:
            now = self._clock()
            self._spares.pop(agent_id, None)
            current = self._round
            if agent_id not in current.joined and agent_id not in current.expected:
                return current.number
            if current.assignment is None:
                current.joined.pop(agent_id, None)
                current.expected = current.expected - {agent_id}
                if len(current.joined) < self.min_nodes:
                    current.min_reached_at = None  # the grace period restarts when min is reached again
                self._advance(now)
            else:
                self._start_round(frozenset(current.joined) - {agent_id})
            return self._round.number

    def new_round(self, drop: Iterable[str] = ()) -> int:
        """Start the next round (the master restarts training), expecting the current members
        except `drop`. Always advances, even from an open round, so every agent re-joins."""
        dropped = frozenset(drop)
        with self._cond:
            current = self._round
            survivors = (frozenset(current.joined) | current.expected) - dropped
            for agent_id in dropped:
                self._spares.pop(agent_id, None)
            self._start_round(survivors)
            return self._round.number

    def expect(self, members: Iterable[str]) -> None:
        """The open round completes once these agents joined (at least `min_nodes`): the
        master knows who is placed, so a start below `max_nodes` need not wait `grace_s`."""
        with self._cond:
            if self._round.assignment is None:
                self._round.expected = frozenset(members)
                self._advance(self._clock())

    def restart_with(self, members: Iterable[str]) -> int:
        """Start the next round expecting exactly `members` (the role was resized: agents that
        left are dropped, new ones are expected). Returns the new round."""
        with self._cond:
            self._start_round(frozenset(members))
            return self._round.number

    def snapshot(self) -> RendezvousSnapshot:
        with self._cond:
            self._advance(self._clock())
            current = self._round
            return RendezvousSnapshot(
                round=current.number,
                joined=tuple(current.joined),
                expected=current.expected,
                spares=tuple(self._spares),
                assignment=current.assignment,
            )

    def wait_complete(self, timeout_s: float, round_: int | None = None) -> Assignment | None:
        """Block until the current round (or `round_`) completes; None on timeout. Raises
        StaleRoundError when `round_` is superseded. The timeout is real time, the grace period
        is measured on the injected clock."""
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while True:
                self._advance(self._clock())
                current = self._round
                if round_ is not None and current.number != round_:
                    raise StaleRoundError(round_, current.number)
                if current.assignment is not None:
                    return current.assignment
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return None
                self._cond.wait(min(remaining, _RECHECK_S))

    # -- internals, called with the lock held --------------------------------------------------

    def _require_member(self, agent_id: str, round_: int) -> RendezvousRound:
        current = self._round
        if round_ != current.number:
            raise StaleRoundError(round_, current.number)
        if agent_id not in current.joined:
            raise NotMemberError(agent_id, round_)
        return current

    def _start_round(self, expected: frozenset[str]) -> None:
        # Spares are forgotten: they keep joining and land in the new round if still alive.
        self._spares.clear()
        self._round = RendezvousRound(number=self._round.number + 1, expected=expected)
        self._changed()

    def _advance(self, now: float) -> None:
        """Complete the current round when one of the rules of the module docstring holds."""
        current = self._round
        if current.assignment is not None:
            return
        count = len(current.joined)
        if count < self.min_nodes:
            return
        if current.min_reached_at is None:
            current.min_reached_at = now
        everyone_back = bool(current.expected) and current.expected <= current.joined.keys()
        if count >= self.max_nodes or everyone_back or now - current.min_reached_at >= self.grace_s:
            current.assignment = assign(current.number, current.joined.values())
            self._changed()

    def _changed(self) -> None:
        self._cond.notify_all()
        for listener in self._listeners:
            try:
                listener()
            except Exception:  # a listener's bug must not break the rendezvous
                log.exception("rendezvous listener failed")
