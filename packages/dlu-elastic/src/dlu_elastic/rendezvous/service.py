"""The ElasticService gRPC server: a thin servicer over the pure `Rendezvous`, and `serve`.

Refusals are decided in ONE place, `_Server._guard`, which wraps every method: bytes that do not
decode -> INVALID_ARGUMENT (gRPC alone would say INTERNAL); a missing or wrong job token ->
UNAUTHENTICATED before the servicer sees the request; then what the servicer raises becomes a
status: `InvalidRequestError` -> INVALID_ARGUMENT, a stale round or a non-member ->
FAILED_PRECONDITION, anything else -> INTERNAL (logged with its traceback). So no request,
however malformed, can take the master down, and the servicer methods read as the happy path.
Refusals are logged a line per kind per interval with a count, never a line per call
(`dlu_elastic.rendezvous.refusals`).

The server is gRPC's asyncio server, on an event loop in a thread of its own, so a rendezvous
call can be *held* until its round completes (`wait_s`, a long poll) without holding a thread:
a thousand agents cost a thousand pending calls, not a thousand threads, and one call per agent
usually does the whole rendezvous (measured in benchmarks/rendezvous_scale.py: every gRPC call
costs this 2-core machine 0.12 to 0.2 ms of server CPU, nearly all of it in gRPC's own layer, so
the number of calls is the figure). Rendezvous calls run on the loop (they take a lock for
microseconds); a held call costs one future in a deadline slot (`RoundWatch`). The loop's thread
and gRPC's poller thread run on one CPU (`dlu_elastic.rendezvous.cpu_affinity` says why).
A heartbeat can be held the same way until the master decides (a new round, or a stop): an
agent whose process failed hears the restart the moment it is decided, not at its next beat.

The servicer (validation, the master's hooks) is `dlu_elastic.rendezvous.servicer`; held calls
wait on `dlu_elastic.rendezvous.round_watch.RoundWatch`. The ElasticMaster plugs its logic in
through plain callables (`on_node_check`, `on_heartbeat`, `on_failure`); they run on the server's few worker threads, after the request was
authenticated, validated and matched to the current round, so they must be thread-safe and
quick: hand anything slow (Ray calls, restarts) to another thread.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import threading
from collections.abc import Awaitable, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, TypeVar

import grpc
import grpc.aio

from dlu.elastic.v1 import elastic_pb2 as pb
from dlu_elastic.rendezvous import cpu_affinity, refusals
from dlu_elastic.rendezvous.refusals import REFUSAL_LOG_INTERVAL_S, RefusalLog
from dlu_elastic.rendezvous.round_watch import RoundWatch
from dlu_elastic.rendezvous.servicer import (
    ElasticServicer,
    FailureHook,
    HeartbeatHook,
    NodeCheckHook,
    PendingActionHook,
    fill_state,
    rendezvous_state,
)
from dlu_elastic.rendezvous.state import AgentView, InvalidRequestError, RendezvousStateError

__all__ = [  # the servicer's names are re-exported: callers import them from here
    "MAX_WAIT_S",
    "SERVICE",
    "ElasticServicer",
    "FailureHook",
    "HeartbeatHook",
    "NodeCheckHook",
    "PendingActionHook",
    "RunningServer",
    "rendezvous_state",
    "serve",
]

log = logging.getLogger(__name__)

SERVICE = "dlu.elastic.v1.ElasticService"
MAX_WAIT_S = 60.0  # a held call is answered after this at the latest, whatever it asked
_DEADLINE_MARGIN_S = 0.05  # a held call answers this long before the client's deadline
_START_TIMEOUT_S = 30.0

_T = TypeVar("_T")


# SO_REUSEPORT off: an explicit port already in use fails in `serve` instead of being silently
# shared with another server. The C-core cancels calls that arrive while more than 3,000 wait
# (its default hard limit): thousands of agents joining at once need more room.
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


_Handler = Callable[[Any, grpc.aio.ServicerContext], Awaitable[Any]]


class _Server:
    """The asyncio side: method table, guard, held calls. Created on the loop's thread."""

    def __init__(
        self, servicer: ElasticServicer, token: str, pool: ThreadPoolExecutor, refusal_log_interval_s: float
    ) -> None:
        self.servicer = servicer
        self._token = token.encode()
        self._pool = pool
        self._loop = asyncio.get_running_loop()
        self.watch = RoundWatch(servicer.rendezvous, self._loop)
        self.refusals = RefusalLog(log, self._loop, refusal_log_interval_s)

    def handlers(self) -> grpc.GenericRpcHandler:
        methods: dict[str, tuple[_Handler, Any, Any]] = {
            "JoinRendezvous": (self._join, pb.JoinRequest, pb.JoinResponse),
            "GetRendezvous": (self._get, pb.GetRendezvousRequest, pb.RendezvousState),
            "ReportNodeCheck": (self._in_pool(self.servicer.report_node_check), pb.NodeCheckReport, pb.Ack),
            "Heartbeat": (self._heartbeat, pb.HeartbeatRequest, pb.HeartbeatResponse),
            "ReportFailure": (self._in_pool(self.servicer.report_failure), pb.FailureReport, pb.Ack),
        }
        return grpc.method_handlers_generic_handler(
            SERVICE,
            {
                name: grpc.unary_unary_rpc_method_handler(
                    self._guard(f"/{SERVICE}/{name}", handler),
                    request_deserializer=_tolerant(request.FromString),
                    response_serializer=response.SerializeToString,
                )
                for name, (handler, request, response) in methods.items()
            },
        )

    def _in_pool(self, call: Callable[[Any], _T]) -> _Handler:
        """The master's hooks may block briefly: they run on worker threads, never on the loop."""

        async def handler(request: Any, context: grpc.aio.ServicerContext) -> _T:
            return await self._loop.run_in_executor(self._pool, call, request)

        return handler

    def _hold_s(self, wait_s: float, context: grpc.aio.ServicerContext) -> float:
        """How long a call may be held: what it asked, within our cap and its deadline."""
        wait = min(wait_s, MAX_WAIT_S)
        remaining = context.time_remaining()
        if remaining is not None:
            wait = min(wait, remaining - _DEADLINE_MARGIN_S)
        return max(wait, 0.0)

    async def _join(self, request: pb.JoinRequest, context: grpc.aio.ServicerContext) -> pb.JoinResponse:
        response = self.servicer.join(request)
        wait = self._hold_s(request.wait_s, context)
        if not response.accepted or wait <= 0:
            return response
        agent_id, round_ = request.agent_id, response.round
        view = await self.watch.until(lambda: self.servicer.settled_view(agent_id, round_), wait)
        if isinstance(view, AgentView):  # else pending at the deadline or superseded: incomplete
            fill_state(response.state, view)
        return response

    async def _get(
        self, request: pb.GetRendezvousRequest, context: grpc.aio.ServicerContext
    ) -> pb.RendezvousState:
        view = self.servicer.view(request)  # refusals (stale, not a member) come at once
        wait = self._hold_s(request.wait_s, context)
        if not view.complete and wait > 0:

            def settled() -> AgentView | None:
                current = self.servicer.view(request)  # raises once the round is superseded
                return current if current.complete else None

            view = await self.watch.until(settled, wait) or self.servicer.view(request)
        return rendezvous_state(view)

    async def _heartbeat(
        self, request: pb.HeartbeatRequest, context: grpc.aio.ServicerContext
    ) -> pb.HeartbeatResponse:
        """The master's hook runs once, on a worker thread; a held beat (`wait_s`) then waits on
        the loop for a decision: a new round (refused as stale) or the master's pending action."""
        response = await self._loop.run_in_executor(self._pool, self.servicer.heartbeat, request)
        wait = self._hold_s(request.wait_s, context)
        if response.action != pb.ACTION_NONE or wait <= 0:
            return response
        decided = await self.watch.until(lambda: self.servicer.decision(request), wait)
        return response if decided is None else decided

    def _guard(self, method: str, handler: _Handler) -> _Handler:
        async def guarded(request: Any, context: grpc.aio.ServicerContext) -> Any:
            if isinstance(request, _Undecodable):
                details = f"undecodable request for {method}: {request.error}"
                self.refusals.refused(refusals.INVALID, method, details)
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, details)
            token = getattr(request, "job_token", "")
            if not token:
                self.refusals.refused(refusals.NO_TOKEN, method, "missing job_token")
                await context.abort(grpc.StatusCode.UNAUTHENTICATED, "missing job_token")
            if not hmac.compare_digest(token.encode(), self._token):
                self.refusals.refused(refusals.WRONG_TOKEN, method, "wrong job_token for this job")
                await context.abort(grpc.StatusCode.UNAUTHENTICATED, "wrong job_token for this job")
            try:
                return await handler(request, context)
            except InvalidRequestError as exc:
                code, details = grpc.StatusCode.INVALID_ARGUMENT, str(exc)
                self.refusals.refused(refusals.INVALID, method, details)
            except RendezvousStateError as exc:  # StaleRoundError, NotMemberError
                code, details = grpc.StatusCode.FAILED_PRECONDITION, str(exc)
                self.refusals.refused(refusals.STALE, method, details)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.exception("internal error in %s", method)
                code, details = grpc.StatusCode.INTERNAL, f"internal error in {method}: {type(exc).__name__}"
            await context.abort(code, details)

        return guarded


@dataclass
class RunningServer:
    """A started ElasticService server; `port` is the bound one (useful with port 0)."""

    host: str
    port: int
    servicer: ElasticServicer
    server: grpc.aio.Server
    loop: asyncio.AbstractEventLoop = field(repr=False)
    thread: threading.Thread = field(repr=False)
    pool: ThreadPoolExecutor = field(repr=False)
    watch: RoundWatch | None = field(repr=False, default=None)
    refusals: RefusalLog | None = field(repr=False, default=None)
    _stopped: bool = field(default=False, repr=False)

    @property
    def address(self) -> str:
        """`host:port` for clients (IPv6 hosts in brackets)."""
        return _target(self.host, self.port)

    def wake_held(self) -> None:
        """Have held calls look again now (the master decided something the rendezvous does not
        show, such as a stop). Any thread."""
        if self.watch is not None:
            self.watch.wake()

    @property
    def serving(self) -> bool:
        """Its event loop still runs the server (what the ElasticMaster's beats stand for)."""
        return not self._stopped and self.thread.is_alive() and self.loop.is_running()

    def stop(self, grace: float | None = None) -> None:
        """Stop accepting calls, answer held calls at once with what they have, let running ones
        finish for `grace` seconds, then cancel them. Idempotent."""
        if self._stopped:
            return
        self._stopped = True
        watch, refused = self.watch, self.refusals

        async def shutdown() -> None:
            if watch is not None:
                watch.release()  # held calls answer now: the grace is not spent waiting on them
            await self.server.stop(grace)
            if watch is not None:
                watch.close()
            if refused is not None:
                refused.close()  # what was counted since the last line

        try:
            asyncio.run_coroutine_threadsafe(shutdown(), self.loop).result()
        finally:
            _stop_loop(self.loop, self.thread)
            self.pool.shutdown(wait=False, cancel_futures=True)

    def __enter__(self) -> RunningServer:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop(0)


def _stop_loop(loop: asyncio.AbstractEventLoop, thread: threading.Thread) -> None:
    if loop.is_running():
        loop.call_soon_threadsafe(loop.stop)
    thread.join(10)
    if not thread.is_alive() and not loop.is_closed():
        loop.close()


def serve(
    host: str,
    port: int = 0,
    *,
    token: str,
    servicer: ElasticServicer,
    max_workers: int = 4,
    options: Sequence[tuple[str, Any]] = (),
    refusal_log_interval_s: float = REFUSAL_LOG_INTERVAL_S,
) -> RunningServer:
    """Start the ElasticService on `host:port` (0 picks a free port) and return at once.

    The server runs on an event loop in a daemon thread of its own; `max_workers` threads run
    the master's hooks. `options` are extra gRPC server arguments (see `_SERVER_OPTIONS` for
    ours). Refused calls are logged at most once per `refusal_log_interval_s` per kind.
    Raises OSError when the address is taken.
    """
    if not token:
        raise ValueError("serve() needs a non-empty job token: the service never runs unauthenticated")
    if not 0 <= port <= 65535:
        raise ValueError(f"port must be in 0..65535, got {port}")
    target = _target(host, port)
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, name="dlu-elastic-grpc-loop", daemon=True)
    thread.start()
    pool = ThreadPoolExecutor(
        max_workers=max_workers,
        thread_name_prefix="dlu-elastic-grpc",
        initializer=cpu_affinity.release_current_thread,  # started from the pinned loop thread
        initargs=(cpu_affinity.allowed_cpus(),),
    )

    async def start() -> tuple[grpc.aio.Server, int, _Server]:
        side = _Server(servicer, token, pool, refusal_log_interval_s)
        server = grpc.aio.server(options=[*_SERVER_OPTIONS, *options])
        server.add_generic_rpc_handlers((side.handlers(),))
        try:
            bound = server.add_insecure_port(target)
        except RuntimeError as exc:  # recent grpcio raises instead of returning 0
            side.watch.remove()
            raise OSError(f"cannot bind the elastic gRPC server to {target}: {exc}") from exc
        if bound == 0:
            side.watch.remove()
            raise OSError(f"cannot bind the elastic gRPC server to {target}")
        await server.start()
        cpu_affinity.pin_with_poller()  # the loop's thread and gRPC's poller: one CPU
        return server, bound, side

    try:
        server, bound, side = asyncio.run_coroutine_threadsafe(start(), loop).result(_START_TIMEOUT_S)
    except BaseException:
        _stop_loop(loop, thread)
        pool.shutdown(wait=False)
        raise
    log.info("elastic gRPC server listening on %s", _target(host, bound))
    return RunningServer(
        host=host,
        port=bound,
        servicer=servicer,
        server=server,
        loop=loop,
        thread=thread,
        pool=pool,
        watch=side.watch,
        refusals=side.refusals,
    )


def _target(host: str, port: int) -> str:
    if ":" in host and not host.startswith("["):
        return f"[{host}]:{port}"
    return f"{host}:{port}"
