"""Agent side of the ElasticService: one small blocking client with a deadline on every call.

Rendezvous calls are long polls: the client asks the master to hold JoinRendezvous (and, when
that was not enough, GetRendezvous) until the round completes, so an agent usually makes one
call per rendezvous instead of polling. A master that does not hold calls (an older one)
answers at once; the client then falls back to polling with back-off.

Every gRPC failure surfaces as `RendezvousError` carrying the status code and the server's
details, so callers branch on `error.code` (FAILED_PRECONDITION: join again; UNAUTHENTICATED:
wrong job; UNAVAILABLE / DEADLINE_EXCEEDED: master unreachable) without touching grpc types.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import grpc

from dlu.elastic.v1 import elastic_pb2 as pb
from dlu.elastic.v1 import elastic_pb2_grpc as pb_grpc

_Response = TypeVar("_Response")
_FIRST_POLL_S = 0.01  # polling fallback: first poll comes quickly
LONG_POLL_S = 5.0  # the most a single held call asks the master to wait; then it asks again
_LAST_CALL_S = 0.1  # with less than this left of an overall wait, another call is pointless


class RendezvousError(Exception):
    """A failed ElasticService call: `code` is the gRPC status, `details` the server's message."""

    def __init__(self, method: str, code: grpc.StatusCode, details: str) -> None:
        super().__init__(f"{method} failed: {code.name}: {details}")
        self.method = method
        self.code = code
        self.details = details


class ElasticClient:
    """Blocking client of one ElasticMaster. `timeout_s` is the deadline of each call.

    `wait_for_ready` makes calls wait (up to their deadline) for an unreachable master to come
    back instead of failing at once with UNAVAILABLE.
    """

    def __init__(
        self,
        address: str,
        token: str,
        timeout_s: float = 10.0,
        *,
        wait_for_ready: bool = False,
        options: Sequence[tuple[str, Any]] = (),
    ) -> None:
        if timeout_s <= 0:
            raise ValueError(f"timeout_s must be > 0, got {timeout_s}")
        self.address = address
        self.timeout_s = timeout_s
        self._token = token
        self._wait_for_ready = wait_for_ready
        self._channel = grpc.insecure_channel(address, options=list(options))
        self._stub = pb_grpc.ElasticServiceStub(self._channel)

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> ElasticClient:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # -- rendezvous ---------------------------------------------------------------------------

    def join(
        self,
        *,
        agent_id: str,
        node_id: str,
        local_ranks: int,
        host: str,
        free_port: int,
        node_rank_hint: int | None = None,
        wait_s: float = 0.0,
        timeout_s: float | None = None,
    ) -> pb.JoinResponse:
        """Join; with `wait_s` the master holds the call until the round completes (the answer
        then has `state`). The call's deadline is `timeout_s` (default: the client's) plus
        `wait_s`."""
        request = pb.JoinRequest(
            job_token=self._token,
            agent_id=agent_id,
            node_id=node_id,
            local_ranks=local_ranks,
            host=host,
            free_port=free_port,
            node_rank_hint=node_rank_hint,
            wait_s=wait_s,
        )
        return self._call("JoinRendezvous", self._stub.JoinRendezvous, request, self._held(timeout_s, wait_s))

    def get_rendezvous(
        self, *, round: int, agent_id: str, wait_s: float = 0.0, timeout_s: float | None = None
    ) -> pb.RendezvousState:
        """The agent's round; with `wait_s` the master holds the call until it completes."""
        request = pb.GetRendezvousRequest(
            job_token=self._token, round=round, agent_id=agent_id, wait_s=wait_s
        )
        return self._call("GetRendezvous", self._stub.GetRendezvous, request, self._held(timeout_s, wait_s))

    def wait_rendezvous(
        self,
        *,
        round: int,
        agent_id: str,
        poll_interval_s: float = 0.1,
        timeout_s: float = 300.0,
    ) -> pb.RendezvousState:
        """Wait until `round` is complete: held calls (long polls), or polls backing off to
        `poll_interval_s` when the master answers at once.

        Raises RendezvousError: DEADLINE_EXCEEDED after `timeout_s` overall, FAILED_PRECONDITION
        when the round was superseded (join again), or whatever the server answered.
        """
        deadline = time.monotonic() + timeout_s
        delay = min(_FIRST_POLL_S, poll_interval_s)
        while True:
            wait, answer_s = self._long_poll(deadline, "GetRendezvous", f"round {round}")
            asked = time.monotonic()
            state = self.get_rendezvous(round=round, agent_id=agent_id, wait_s=wait, timeout_s=answer_s)
            if state.complete:
                return state
            if time.monotonic() + max(delay, _LAST_CALL_S) >= deadline:
                raise RendezvousError(
                    "GetRendezvous",
                    grpc.StatusCode.DEADLINE_EXCEEDED,
                    f"round {round} not complete after {timeout_s:g} s ({state.joined_agents} agents joined)",
                )
            if time.monotonic() - asked < wait / 2:  # not held: a master that only answers polls
                time.sleep(delay)
                delay = min(delay * 2, poll_interval_s)

    def rendezvous(
        self,
        *,
        agent_id: str,
        node_id: str,
        local_ranks: int,
        host: str,
        free_port: int,
        node_rank_hint: int | None = None,
        poll_interval_s: float = 0.1,
        timeout_s: float = 300.0,
    ) -> pb.RendezvousState:
        """Join and wait until a round including this agent completes, joining again when the
        round moves on under it or when it is parked as a spare. The common agent entry point."""
        deadline = time.monotonic() + timeout_s
        rejoin_delay = 0.0  # the first re-join after a superseded round is immediate
        while True:
            wait, answer_s = self._long_poll(deadline, "JoinRendezvous", "the rendezvous")
            joined = self.join(
                agent_id=agent_id,
                node_id=node_id,
                local_ranks=local_ranks,
                host=host,
                free_port=free_port,
                node_rank_hint=node_rank_hint,
                wait_s=wait,
                timeout_s=answer_s,
            )
            if joined.state.complete:  # held until the round completed: the usual single call
                return joined.state
            if not joined.accepted:  # the round is full: try again later
                if time.monotonic() + poll_interval_s >= deadline:
                    raise RendezvousError(
                        "JoinRendezvous",
                        grpc.StatusCode.DEADLINE_EXCEEDED,
                        f"still a spare of full round {joined.round} after {timeout_s:g} s",
                    )
                time.sleep(poll_interval_s)
                continue
            try:
                return self.wait_rendezvous(
                    round=joined.round,
                    agent_id=agent_id,
                    poll_interval_s=poll_interval_s,
                    timeout_s=max(deadline - time.monotonic(), 0.0),
                )
            except RendezvousError as exc:
                if exc.code != grpc.StatusCode.FAILED_PRECONDITION:
                    raise
            time.sleep(min(rejoin_delay, max(deadline - time.monotonic(), 0.0)))
            rejoin_delay = poll_interval_s  # rounds churning: do not hammer the master

    # -- reports ------------------------------------------------------------------------------

    def report_node_check(
        self,
        *,
        round: int,
        agent_id: str,
        node_id: str,
        elapsed_s: float,
        success: bool,
        error: str = "",
        check_round: int = 0,
        timeout_s: float | None = None,
    ) -> None:
        request = pb.NodeCheckReport(
            job_token=self._token,
            round=round,
            agent_id=agent_id,
            node_id=node_id,
            elapsed_s=elapsed_s,
            success=success,
            error=error,
            check_round=check_round,
        )
        self._call("ReportNodeCheck", self._stub.ReportNodeCheck, request, timeout_s)

    def heartbeat(
        self,
        *,
        round: int,
        agent_id: str,
        step: int,
        metric: float | None = None,
        timestamp: float | None = None,
        wait_s: float = 0.0,
        timeout_s: float | None = None,
        idle: bool = False,
    ) -> pb.Action:
        """Send progress; returns what the master wants (ACTION_NONE, ACTION_RESTART, ACTION_STOP).
        With `wait_s` the master holds the call until it decides something (a new round comes
        as FAILED_PRECONDITION); the call's deadline is `timeout_s` plus `wait_s`. `idle`: this
        agent runs no training process (it is not told ACTION_HALT)."""
        request = self._beat_request(round, agent_id, step, metric, timestamp, wait_s, idle)
        return self._call("Heartbeat", self._stub.Heartbeat, request, self._held(timeout_s, wait_s)).action

    def heartbeat_async(
        self,
        *,
        round: int,
        agent_id: str,
        step: int,
        metric: float | None = None,
        wait_s: float = 0.0,
        timeout_s: float | None = None,
    ) -> HeldBeat:
        """`heartbeat` without blocking: the caller waits on the returned call (a held beat is
        how a rank hears of a new round the moment it opens, while it watches its process)."""
        request = self._beat_request(round, agent_id, step, metric, None, wait_s, False)
        future = self._stub.Heartbeat.future(
            request, timeout=self._held(timeout_s, wait_s), wait_for_ready=self._wait_for_ready
        )
        return HeldBeat(future)

    def _beat_request(
        self,
        round: int,
        agent_id: str,
        step: int,
        metric: float | None,
        timestamp: float | None,
        wait_s: float,
        idle: bool,
    ) -> pb.HeartbeatRequest:
        return pb.HeartbeatRequest(
            job_token=self._token,
            round=round,
            agent_id=agent_id,
            step=step,
            has_metric=metric is not None,
            metric=0.0 if metric is None else metric,
            timestamp=time.time() if timestamp is None else timestamp,
            wait_s=wait_s,
            idle=idle,
        )

    def report_failure(
        self,
        *,
        round: int,
        agent_id: str,
        local_rank: int,
        exit_code: int,
        error: str = "",
        timeout_s: float | None = None,
    ) -> None:
        request = pb.FailureReport(
            job_token=self._token,
            round=round,
            agent_id=agent_id,
            local_rank=local_rank,
            exit_code=exit_code,
            error=error,
        )
        self._call("ReportFailure", self._stub.ReportFailure, request, timeout_s)

    # -- plumbing -----------------------------------------------------------------------------

    def _remaining(self, deadline: float, method: str, what: str) -> float:
        """Per-call deadline: the client's timeout, cut to what is left of an overall wait."""
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise RendezvousError(method, grpc.StatusCode.DEADLINE_EXCEEDED, f"timed out waiting for {what}")
        return min(self.timeout_s, remaining)

    def _long_poll(self, deadline: float, method: str, what: str) -> tuple[float, float]:
        """(how long the master may hold the next call, time left for its answer): at most
        LONG_POLL_S held, and the two together within what is left of the overall wait."""
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise RendezvousError(method, grpc.StatusCode.DEADLINE_EXCEEDED, f"timed out waiting for {what}")
        wait = min(LONG_POLL_S, remaining * 0.9)
        return wait, min(self.timeout_s, remaining - wait)

    def _held(self, timeout_s: float | None, wait_s: float) -> float:
        """A held call's deadline: the time to answer plus the time the master may hold it (a
        wait that is no number of seconds is the master's to refuse; it adds nothing here)."""
        held = wait_s if math.isfinite(wait_s) and wait_s > 0 else 0.0
        return (self.timeout_s if timeout_s is None else timeout_s) + held

    def _call(
        self,
        method: str,
        rpc: Callable[..., _Response],
        request: object,
        timeout_s: float | None,
    ) -> _Response:
        try:
            return rpc(
                request,
                timeout=self.timeout_s if timeout_s is None else timeout_s,
                wait_for_ready=self._wait_for_ready,
            )
        except grpc.RpcError as exc:
            if isinstance(exc, grpc.Call):
                raise RendezvousError(method, exc.code(), exc.details() or "") from None
            raise RendezvousError(method, grpc.StatusCode.UNKNOWN, str(exc)) from None


class HeldBeat:
    """A heartbeat on its way (`ElasticClient.heartbeat_async`)."""

    def __init__(self, future: Any) -> None:
        self._future = future

    def done(self) -> bool:
        return bool(self._future.done())

    def on_done(self, callback: Callable[[], None]) -> None:
        """Call `callback()` (on a gRPC thread) once the answer or an error is in."""
        self._future.add_done_callback(lambda _: callback())

    def cancel(self) -> None:
        """Give up the call (the master stops holding it); its answer is never read."""
        self._future.cancel()

    def action(self) -> pb.Action:
        """The master's answer; blocks until it is in.

        Raises:
            RendezvousError: the call failed, with its status code (as `heartbeat`).
        """
        try:
            return self._future.result().action
        except grpc.RpcError as exc:
            if isinstance(exc, grpc.Call):
                raise RendezvousError("Heartbeat", exc.code(), exc.details() or "") from None
            raise RendezvousError("Heartbeat", grpc.StatusCode.UNKNOWN, str(exc)) from None
