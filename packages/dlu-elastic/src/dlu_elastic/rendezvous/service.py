"""The ElasticService gRPC server: a thin servicer over the pure `Rendezvous`, and `serve`.

Refusals are decided in ONE place, the `_Guard` interceptor that wraps every method: bytes that
do not decode -> INVALID_ARGUMENT (gRPC alone would say INTERNAL); a missing or wrong job token
-> UNAUTHENTICATED before the servicer sees the request; then what the servicer raises becomes
a status: `InvalidRequestError` -> INVALID_ARGUMENT, a stale round or a non-member ->
FAILED_PRECONDITION, anything else -> INTERNAL (logged with its traceback). So no request,
however malformed, can take the master down, and the servicer methods read as the happy path.

The ElasticMaster plugs its logic in through plain callables (`on_node_check`, `on_heartbeat`,
`on_failure`); they run on the server's few worker threads, after the request was
authenticated, validated and matched to the current round, so they must be thread-safe and
quick: hand anything slow (Ray calls, restarts) to another thread.
"""

from __future__ import annotations

import hmac
import logging
import math
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, cast

import grpc

from dlu.elastic.v1 import elastic_pb2 as pb
from dlu.elastic.v1 import elastic_pb2_grpc as pb_grpc
from dlu_elastic.rendezvous.state import (
    AgentInfo,
    InvalidRequestError,
    Rendezvous,
    RendezvousStateError,
    check_id,
)

log = logging.getLogger(__name__)

NodeCheckHook = Callable[[pb.NodeCheckReport], None]
HeartbeatHook = Callable[[pb.HeartbeatRequest], "pb.Action | int"]
FailureHook = Callable[[pb.FailureReport], None]

_ACTIONS = frozenset(pb.Action.values())
_MAX_ERROR_LENGTH = 64 * 1024  # error texts are tracebacks; more is a runaway log, not a report


class ElasticServicer(pb_grpc.ElasticServiceServicer):
    """Validates requests and delegates to the rendezvous and the master's hooks."""

    def __init__(
        self,
        rendezvous: Rendezvous,
        *,
        on_node_check: NodeCheckHook | None = None,
        on_heartbeat: HeartbeatHook | None = None,
        on_failure: FailureHook | None = None,
    ) -> None:
        self.rendezvous = rendezvous
        self._on_node_check = on_node_check
        self._on_heartbeat = on_heartbeat
        self._on_failure = on_failure

    def JoinRendezvous(self, request: pb.JoinRequest, context: grpc.ServicerContext) -> pb.JoinResponse:
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

    def GetRendezvous(
        self, request: pb.GetRendezvousRequest, context: grpc.ServicerContext
    ) -> pb.RendezvousState:
        check_id("agent_id", request.agent_id)
        view = self.rendezvous.view(request.agent_id, request.round)
        state = pb.RendezvousState(round=view.round, joined_agents=view.joined, waiting_agents=view.waiting)
        if view.assignment is not None and view.placement is not None:
            state.complete = True
            state.world_size = view.assignment.world_size
            state.group_world_size = view.assignment.group_world_size
            state.master_addr = view.assignment.master_addr
            state.master_port = view.assignment.master_port
            state.group_rank = view.placement.group_rank
            state.rank_offset = view.placement.rank_offset
        return state

    def ReportNodeCheck(self, request: pb.NodeCheckReport, context: grpc.ServicerContext) -> pb.Ack:
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

    def Heartbeat(self, request: pb.HeartbeatRequest, context: grpc.ServicerContext) -> pb.HeartbeatResponse:
        check_id("agent_id", request.agent_id)
        if request.step < 0:
            raise InvalidRequestError(f"step must be >= 0, got {request.step}")
        if not (math.isfinite(request.timestamp) and request.timestamp >= 0):
            raise InvalidRequestError(
                f"timestamp must be finite seconds since the epoch, got {request.timestamp}"
            )
        # A NaN or infinite metric is legitimate: a diverging loss is exactly what the master wants to see.
        self.rendezvous.require_member(request.agent_id, request.round)
        action = pb.ACTION_NONE if self._on_heartbeat is None else self._on_heartbeat(request)
        if action not in _ACTIONS:
            raise RuntimeError(f"on_heartbeat returned {action!r}, not an elastic.v1.Action")
        return pb.HeartbeatResponse(action=cast("pb.Action", action))

    def ReportFailure(self, request: pb.FailureReport, context: grpc.ServicerContext) -> pb.Ack:
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


def _check_error_text(error: str) -> None:
    if len(error) > _MAX_ERROR_LENGTH:
        raise InvalidRequestError(f"error is {len(error)} characters long; the limit is {_MAX_ERROR_LENGTH}")


_Behavior = Callable[[Any, grpc.ServicerContext], Any]

# SO_REUSEPORT off: an explicit port already in use fails in `serve` instead of being silently
# shared with another server. The C-core cancels calls that arrive while more than 3,000 wait for
# a worker thread (its default hard limit): thousands of agents joining at once need more room.
_SERVER_OPTIONS: tuple[tuple[str, Any], ...] = (
    ("grpc.so_reuseport", 0),
    ("grpc.server.max_pending_requests", 16384),
    ("grpc.server.max_pending_requests_hard_limit", 65536),
)


@dataclass(frozen=True, slots=True)
class _Undecodable:
    """Stands in for a request whose bytes are not the expected message (gRPC itself would
    answer INTERNAL; a bad request is INVALID_ARGUMENT)."""

    error: str


def _tolerant(deserializer: Callable[[bytes], Any]) -> Callable[[bytes], Any]:
    def deserialize(data: bytes) -> Any:
        try:
            return deserializer(data)
        except Exception as exc:  # protobuf's DecodeError, or worse
            return _Undecodable(f"{type(exc).__name__}: {exc}")

    return deserialize


class _Guard(grpc.ServerInterceptor):
    """Token check and exception-to-status mapping for every unary method (see module docstring)."""

    def __init__(self, token: str) -> None:
        self._token = token.encode()
        self._wrapped: dict[str, grpc.RpcMethodHandler] = {}

    def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], grpc.RpcMethodHandler | None],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler | None:
        method: str = handler_call_details.method
        cached = self._wrapped.get(method)
        if cached is not None:
            return cached
        handler = continuation(handler_call_details)
        behavior: _Behavior | None = None if handler is None else handler.unary_unary
        if handler is None or behavior is None:
            return handler  # unknown method: gRPC answers UNIMPLEMENTED; we serve no streams
        deserializer: Callable[[bytes], Any] | None = handler.request_deserializer
        wrapped = grpc.unary_unary_rpc_method_handler(
            self._guarded(method, behavior),
            request_deserializer=None if deserializer is None else _tolerant(deserializer),
            response_serializer=handler.response_serializer,
        )
        self._wrapped[method] = wrapped
        return wrapped

    def _guarded(self, method: str, behavior: _Behavior) -> _Behavior:
        def guarded(request: Any, context: grpc.ServicerContext) -> Any:
            if isinstance(request, _Undecodable):
                context.abort(
                    grpc.StatusCode.INVALID_ARGUMENT, f"undecodable request for {method}: {request.error}"
                )
            token = getattr(request, "job_token", "")
            if not token:
                log.warning("refused %s: no job token", method)
                context.abort(grpc.StatusCode.UNAUTHENTICATED, "missing job_token")
            if not hmac.compare_digest(token.encode(), self._token):
                log.warning("refused %s: wrong job token", method)
                context.abort(grpc.StatusCode.UNAUTHENTICATED, "wrong job_token for this job")
            try:
                return behavior(request, context)
            except InvalidRequestError as exc:
                code, details = grpc.StatusCode.INVALID_ARGUMENT, str(exc)
            except RendezvousStateError as exc:  # StaleRoundError, NotMemberError
                code, details = grpc.StatusCode.FAILED_PRECONDITION, str(exc)
            except Exception as exc:
                log.exception("internal error in %s", method)
                code, details = grpc.StatusCode.INTERNAL, f"internal error in {method}: {type(exc).__name__}"
            log.debug("refused %s: %s %s", method, code.name, details)
            context.abort(code, details)

        return guarded


@dataclass
class RunningServer:
    """A started ElasticService server; `port` is the bound one (useful with port 0)."""

    host: str
    port: int
    servicer: ElasticServicer
    server: grpc.Server

    @property
    def address(self) -> str:
        """`host:port` for clients (IPv6 hosts in brackets)."""
        return _target(self.host, self.port)

    def stop(self, grace: float | None = None) -> None:
        """Stop accepting calls, let running ones finish for `grace` seconds, then cancel them."""
        self.server.stop(grace).wait()

    def __enter__(self) -> RunningServer:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop(0)


def serve(
    host: str,
    port: int = 0,
    *,
    token: str,
    servicer: ElasticServicer,
    max_workers: int = 4,
    options: Sequence[tuple[str, Any]] = (),
) -> RunningServer:
    """Start the ElasticService on `host:port` (0 picks a free port) and return at once.

    Few workers on purpose: handlers hold the GIL for microseconds, and more threads only add
    contention (measured with benchmarks/rendezvous_scale.py). `options` are extra gRPC server
    arguments (see `_SERVER_OPTIONS` for ours). Raises OSError when the address is taken.
    """
    if not token:
        raise ValueError("serve() needs a non-empty job token: the service never runs unauthenticated")
    if not 0 <= port <= 65535:
        raise ValueError(f"port must be in 0..65535, got {port}")
    server = grpc.server(
        ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="dlu-elastic-grpc"),
        interceptors=[_Guard(token)],
        options=[*_SERVER_OPTIONS, *options],
    )
    pb_grpc.add_ElasticServiceServicer_to_server(servicer, server)
    target = _target(host, port)
    try:
        bound = server.add_insecure_port(target)
    except RuntimeError as exc:  # recent grpcio raises instead of returning 0
        raise OSError(f"cannot bind the elastic gRPC server to {target}: {exc}") from exc
    if bound == 0:
        raise OSError(f"cannot bind the elastic gRPC server to {target}")
    server.start()
    log.info("elastic gRPC server listening on %s", _target(host, bound))
    return RunningServer(host=host, port=bound, servicer=servicer, server=server)


def _target(host: str, port: int) -> str:
    if ":" in host and not host.startswith("["):
        return f"[{host}]:{port}"
    return f"{host}:{port}"
