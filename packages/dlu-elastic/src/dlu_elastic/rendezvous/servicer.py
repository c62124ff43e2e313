"""The ElasticService's request handling, transport free: validation, then the rendezvous and
the master's hooks (`on_node_check`, `on_heartbeat`, `on_failure`).

The gRPC server around it (authentication, refusals, held calls) is
`dlu_elastic.rendezvous.service`, which re-exports these names. A held heartbeat (`wait_s`) asks
`pending_action` whether the master has decided something, without recording another beat.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Literal, cast

from dlu.elastic.v1 import elastic_pb2 as pb
from dlu_elastic.rendezvous.state import (
    AgentInfo,
    AgentView,
    InvalidRequestError,
    Rendezvous,
    check_id,
)

NodeCheckHook = Callable[[pb.NodeCheckReport], None]
HeartbeatHook = Callable[[pb.HeartbeatRequest], "pb.Action | int"]
FailureHook = Callable[[pb.FailureReport], None]
PendingActionHook = Callable[[], "pb.Action | int"]

_ACTIONS = frozenset(pb.Action.values())
_MAX_ERROR_LENGTH = 64 * 1024  # error texts are tracebacks; more is a runaway log, not a report


class ElasticServicer:
    """Validates requests and delegates to the rendezvous and the master's hooks. Transport
    free: the server (`service`) calls these with decoded, authenticated requests."""

    def __init__(
        self,
        rendezvous: Rendezvous,
        *,
        on_node_check: NodeCheckHook | None = None,
        on_heartbeat: HeartbeatHook | None = None,
        on_failure: FailureHook | None = None,
        pending_action: PendingActionHook | None = None,
        training_over: bool = False,
    ) -> None:
        self.rendezvous = rendezvous
        self.training_over = training_over
        self._on_node_check = on_node_check
        self._on_heartbeat = on_heartbeat
        self._on_failure = on_failure
        self._pending_action = pending_action

    def join(self, request: pb.JoinRequest) -> pb.JoinResponse:
        _check_wait(request.wait_s)
        agent = AgentInfo(
            agent_id=request.agent_id,
            node_id=request.node_id,
            local_ranks=request.local_ranks,
            host=request.host,
            free_port=request.free_port,
            node_rank_hint=request.node_rank_hint if request.HasField("node_rank_hint") else None,
        )
        result = self.rendezvous.join(agent)
        return pb.JoinResponse(round=result.round, accepted=result.accepted)

    def view(self, request: pb.GetRendezvousRequest) -> AgentView:
        check_id("agent_id", request.agent_id)
        _check_wait(request.wait_s)
        return self.rendezvous.view(request.agent_id, request.round)

    def settled_view(self, agent_id: str, round_: int) -> AgentView | Literal[False] | None:
        """The agent's view once `round_` is complete; False once it never can be (superseded,
        or the agent left it: the agent must join again, at once); None while it is pending."""
        return self.rendezvous.settled(agent_id, round_)

    def report_node_check(self, request: pb.NodeCheckReport) -> pb.Ack:
        check_id("agent_id", request.agent_id)
        check_id("node_id", request.node_id)
        _check_error_text(request.error)
        if not (math.isfinite(request.elapsed_s) and request.elapsed_s >= 0):
            raise InvalidRequestError(f"elapsed_s must be a finite number >= 0, got {request.elapsed_s}")
        if request.check_round not in (0, 1, 2):
            raise InvalidRequestError(f"check_round must be 0, 1 or 2, got {request.check_round}")
        self.rendezvous.require_member(request.agent_id, request.round)
        if self._on_node_check is not None:
            self._on_node_check(request)
        return pb.Ack()

    def heartbeat(self, request: pb.HeartbeatRequest) -> pb.HeartbeatResponse:
        check_id("agent_id", request.agent_id)
        if request.step < 0:
            raise InvalidRequestError(f"step must be >= 0, got {request.step}")
        if not (math.isfinite(request.timestamp) and request.timestamp >= 0):
            raise InvalidRequestError(
                f"timestamp must be finite seconds since the epoch, got {request.timestamp}"
            )
        _check_wait(request.wait_s)
        # A NaN or infinite metric is legitimate: a diverging loss is exactly what the master wants to see.
        if self._over_for(request):
            return pb.HeartbeatResponse(action=pb.ACTION_STOP)
        self.rendezvous.require_member(request.agent_id, request.round)
        action = pb.ACTION_NONE if self._on_heartbeat is None else self._on_heartbeat(request)
        return _response("on_heartbeat", _for(request, action))

    def decision(self, request: pb.HeartbeatRequest) -> pb.HeartbeatResponse | None:
        """For a held heartbeat: the master's answer once it has one, None while it has nothing
        to say. Raises StaleRoundError once the agent's round is superseded (a restart)."""
        if self._over_for(request):
            return pb.HeartbeatResponse(action=pb.ACTION_STOP)
        self.rendezvous.require_member(request.agent_id, request.round)
        action = pb.ACTION_NONE if self._pending_action is None else self._pending_action()
        action = _for(request, action)
        return None if action == pb.ACTION_NONE else _response("pending_action", action)

    def _over_for(self, request: pb.HeartbeatRequest) -> bool:
        """An idle agent of a role whose training is over (every rank had finished before this
        master started) is told to stop whatever its round: a finished rank that followed a
        replaced master must not train again."""
        return request.idle and self.training_over

    def report_failure(self, request: pb.FailureReport) -> pb.Ack:
        check_id("agent_id", request.agent_id)
        _check_error_text(request.error)
        if request.local_rank < -1:
            raise InvalidRequestError(
                f"local_rank must be >= 0, or -1 for the agent itself, got {request.local_rank}"
            )
        self.rendezvous.require_member(request.agent_id, request.round)
        if self._on_failure is not None:
            self._on_failure(request)
        return pb.Ack()


def rendezvous_state(view: AgentView) -> pb.RendezvousState:
    """The wire form of what one agent knows about its round."""
    state = pb.RendezvousState()
    fill_state(state, view)
    return state


def fill_state(state: pb.RendezvousState, view: AgentView) -> None:
    """Write `view` into an empty `state` in place (a held join's answer: no copy per agent)."""
    state.round = view.round
    state.joined_agents = view.joined
    state.waiting_agents = view.waiting
    assignment, placement = view.assignment, view.placement
    if assignment is not None and placement is not None:
        state.complete = True
        state.world_size = assignment.world_size
        state.group_world_size = len(assignment.placements)
        state.master_addr = assignment.master_addr
        state.master_port = assignment.master_port
        state.group_rank = placement.group_rank
        state.rank_offset = placement.rank_offset


def _response(hook: str, action: pb.Action | int) -> pb.HeartbeatResponse:
    if action not in _ACTIONS:
        raise RuntimeError(f"{hook} returned {action!r}, not an elastic.v1.Action")
    return pb.HeartbeatResponse(action=cast("pb.Action", action))


def _check_error_text(error: str) -> None:
    if len(error) > _MAX_ERROR_LENGTH:
        raise InvalidRequestError(f"error is {len(error)} characters long; the limit is {_MAX_ERROR_LENGTH}")


def _for(request: pb.HeartbeatRequest, action: int) -> int:
    """The master's action as this agent hears it: a halt is no news to an idle agent."""
    return pb.ACTION_NONE if action == pb.ACTION_HALT and request.idle else action


def _check_wait(wait_s: float) -> None:
    if not (math.isfinite(wait_s) and wait_s >= 0):
        raise InvalidRequestError(f"wait_s must be a finite number of seconds >= 0, got {wait_s}")
