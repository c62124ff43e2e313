"""The ElasticService over real gRPC on 127.0.0.1: rendezvous of agents in threads, refusals with
the right status codes, a server that survives bad input, and client deadlines."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import NotRequired, TypedDict, cast

import grpc
import pytest

from dlu.elastic.v1 import elastic_pb2 as pb
from dlu.elastic.v1 import elastic_pb2_grpc as pb_grpc
from dlu_elastic.rendezvous.client import ElasticClient, RendezvousError
from dlu_elastic.rendezvous.service import ElasticServicer, RunningServer, serve
from dlu_elastic.rendezvous.state import Rendezvous

pytestmark = pytest.mark.timeout(60)

TOKEN = "s3cret-job-token"


@dataclass
class Hooks:
    node_checks: list[pb.NodeCheckReport] = field(default_factory=list)
    heartbeats: list[pb.HeartbeatRequest] = field(default_factory=list)
    failures: list[pb.FailureReport] = field(default_factory=list)
    action: int = pb.ACTION_NONE
    heartbeat_error: Exception | None = None

    def on_heartbeat(self, request: pb.HeartbeatRequest) -> int:
        if self.heartbeat_error is not None:
            raise self.heartbeat_error
        self.heartbeats.append(request)
        return self.action


@dataclass
class Master:
    rendezvous: Rendezvous
    hooks: Hooks
    server: RunningServer

    def client(self, token: str = TOKEN, timeout_s: float = 5.0) -> ElasticClient:
        return ElasticClient(self.server.address, token, timeout_s)


def start_master(
    min_nodes: int, max_nodes: int, grace_s: float = 30.0, clock: Callable[[], float] = time.monotonic
) -> Master:
    rendezvous = Rendezvous(min_nodes=min_nodes, max_nodes=max_nodes, grace_s=grace_s, clock=clock)
    hooks = Hooks()
    servicer = ElasticServicer(
        rendezvous,
        on_node_check=hooks.node_checks.append,
        on_heartbeat=hooks.on_heartbeat,
        on_failure=hooks.failures.append,
    )
    return Master(rendezvous, hooks, serve("127.0.0.1", 0, token=TOKEN, servicer=servicer))


@pytest.fixture
def master() -> Iterator[Master]:
    running = start_master(min_nodes=2, max_nodes=2)
    yield running
    running.server.stop(0)


class JoinArgs(TypedDict):
    agent_id: str
    node_id: str
    local_ranks: int
    host: str
    free_port: int
    node_rank_hint: NotRequired[int | None]


def join_args(i: int) -> JoinArgs:
    return {
        "agent_id": f"agent-{i}",
        "node_id": f"node-{i}",
        "local_ranks": 2,
        "host": "127.0.0.1",
        "free_port": 29500 + i,
    }


def rendezvous_in_threads(master: Master, indices: list[int]) -> dict[int, pb.RendezvousState]:
    def agent(i: int) -> pb.RendezvousState:
        with master.client() as client:
            return client.rendezvous(**join_args(i), poll_interval_s=0.02, timeout_s=20)

    with ThreadPoolExecutor(len(indices)) as pool:
        return dict(zip(indices, pool.map(agent, indices), strict=True))


def form_round(master: Master) -> int:
    states = rendezvous_in_threads(master, [0, 1])
    return states[0].round


def expect_status(code: grpc.StatusCode, call: Callable[[], object]) -> RendezvousError:
    with pytest.raises(RendezvousError) as info:
        call()
    assert info.value.code == code, info.value
    return info.value


def wait_until(what: str, condition: Callable[[], bool], timeout_s: float = 30.0) -> None:
    """Poll `condition` until it holds; fail naming `what` after a generous deadline."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


def held_calls(master: Master) -> int:
    watch = master.server.watch
    return watch.held if watch is not None else 0


def finishes(call: Callable[[], object], within_s: float = 30.0) -> object:
    """`call()` in a thread; its result (or exception) once it returns, failing if it is still
    running after `within_s` (a call that should have ended at its own short deadline hung)."""
    pool = ThreadPoolExecutor(1)
    try:
        return pool.submit(call).result(timeout=within_s)
    except TimeoutError:
        pytest.fail(f"the call did not return within {within_s} s")
    finally:
        pool.shutdown(wait=False)  # a hung call must not hang the test too


# -- rendezvous -----------------------------------------------------------------------------


def test_four_agents_in_threads_get_consistent_ranks() -> None:
    master = start_master(min_nodes=4, max_nodes=4)
    try:
        states = rendezvous_in_threads(master, [3, 1, 0, 2])
    finally:
        master.server.stop(0)
    assert {s.round for s in states.values()} == {1}
    assert all(s.complete and s.world_size == 8 and s.group_world_size == 4 for s in states.values())
    # node ids sort the agents: agent-i gets node rank i, global ranks 2i and 2i+1
    assert {i: (s.group_rank, s.rank_offset) for i, s in states.items()} == {i: (i, 2 * i) for i in range(4)}
    assert {(s.master_addr, s.master_port) for s in states.values()} == {("127.0.0.1", 29500)}


def test_node_rank_hint_travels_and_picks_the_torch_master() -> None:
    master = start_master(min_nodes=2, max_nodes=2)
    try:
        with master.client() as client:
            client.join(**join_args(0))
            hinted = join_args(1)
            hinted["node_rank_hint"] = 0
            client.join(**hinted)
            state = client.wait_rendezvous(round=1, agent_id="agent-0", timeout_s=5)
    finally:
        master.server.stop(0)
    assert (state.group_rank, state.rank_offset) == (1, 2)
    assert (state.master_addr, state.master_port) == ("127.0.0.1", 29501)


def test_membership_change_moves_everyone_to_the_next_round() -> None:
    master = start_master(min_nodes=2, max_nodes=3, grace_s=0.2)
    try:
        with master.client() as client:
            first = rendezvous_in_threads(master, [0, 1])  # complete at min, after the grace period
            assert first[0].round == 1 and first[0].group_world_size == 2
            # a third agent arrives: the members learn of round 2 from their next heartbeat
            assert client.join(**join_args(2)).round == 2
            error = expect_status(
                grpc.StatusCode.FAILED_PRECONDITION,
                lambda: client.heartbeat(round=1, agent_id="agent-0", step=10),
            )
            assert "round 1" in error.details and "round 2" in error.details
            second = rendezvous_in_threads(master, [0, 1, 2])
    finally:
        master.server.stop(0)
    assert {s.round for s in second.values()} == {2}
    assert sorted(s.group_rank for s in second.values()) == [0, 1, 2]
    assert {s.world_size for s in second.values()} == {6}


# -- hooks ----------------------------------------------------------------------------------


def test_reports_reach_the_master_hooks(master: Master) -> None:
    round_ = form_round(master)
    master.hooks.action = pb.ACTION_RESTART
    with master.client() as client:
        client.report_node_check(
            round=round_, agent_id="agent-0", node_id="node-0", elapsed_s=0.25, success=True, check_round=1
        )
        action = client.heartbeat(
            round=round_, agent_id="agent-1", step=7, metric=float("nan"), timestamp=5.0
        )
        client.report_failure(round=round_, agent_id="agent-1", local_rank=1, exit_code=-9, error="killed")
    assert action == pb.ACTION_RESTART
    assert [(r.agent_id, r.elapsed_s, r.check_round) for r in master.hooks.node_checks] == [
        ("agent-0", 0.25, 1)
    ]
    (beat,) = master.hooks.heartbeats
    assert (beat.step, beat.has_metric, beat.timestamp) == (7, True, 5.0)
    assert [(f.local_rank, f.exit_code, f.error) for f in master.hooks.failures] == [(1, -9, "killed")]


# -- refusals -------------------------------------------------------------------------------


def all_calls(client: ElasticClient, round_: int) -> dict[str, Callable[[], object]]:
    return {
        "join": lambda: client.join(**join_args(0)),
        "get": lambda: client.get_rendezvous(round=round_, agent_id="agent-0"),
        "node_check": lambda: client.report_node_check(
            round=round_, agent_id="agent-0", node_id="node-0", elapsed_s=1.0, success=True
        ),
        "heartbeat": lambda: client.heartbeat(round=round_, agent_id="agent-0", step=1),
        "failure": lambda: client.report_failure(round=round_, agent_id="agent-0", local_rank=0, exit_code=1),
    }


@pytest.mark.parametrize("token", ["", "wrong-token", "s3cret-job-token-but-longer"])
def test_bad_or_missing_token_is_unauthenticated_everywhere(master: Master, token: str) -> None:
    round_ = form_round(master)
    with master.client(token=token) as client:
        for name, call in all_calls(client, round_).items():
            error = expect_status(grpc.StatusCode.UNAUTHENTICATED, call)
            assert "job_token" in error.details, name
    assert not master.hooks.heartbeats and not master.hooks.failures and not master.hooks.node_checks
    assert master.rendezvous.round == round_  # the refused join changed nothing


@pytest.mark.parametrize("stale", [0, 1, 99])
def test_stale_round_is_failed_precondition_naming_both_rounds(master: Master, stale: int) -> None:
    form_round(master)
    current = master.rendezvous.new_round()  # the master restarted training: round 2
    with master.client() as client:
        calls = all_calls(client, stale)
        del calls["join"]  # joining carries no round
        for name, call in calls.items():
            error = expect_status(grpc.StatusCode.FAILED_PRECONDITION, call)
            assert f"round {stale} " in error.details and f"round {current}" in error.details, name
    assert not master.hooks.heartbeats


def test_non_member_is_failed_precondition(master: Master) -> None:
    round_ = form_round(master)
    with master.client() as client:
        error = expect_status(
            grpc.StatusCode.FAILED_PRECONDITION,
            lambda: client.heartbeat(round=round_, agent_id="stranger", step=1),
        )
    assert "not a member" in error.details


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"agent_id": ""}, "agent_id is empty"),
        ({"node_id": ""}, "node_id is empty"),
        ({"host": ""}, "host is empty"),
        ({"local_ranks": -1}, "local_ranks"),
        ({"local_ranks": 0}, "local_ranks"),
        ({"free_port": 0}, "free_port"),
        ({"free_port": 65536}, "free_port"),
        ({"node_rank_hint": -2}, "node_rank_hint"),
        ({"agent_id": "a" * 10_000}, "limit is 256"),
    ],
)
def test_malformed_join_is_invalid_argument(
    master: Master, overrides: dict[str, object], message: str
) -> None:
    with master.client() as client:
        args = cast(JoinArgs, {**join_args(0), **overrides})
        error = expect_status(grpc.StatusCode.INVALID_ARGUMENT, lambda: client.join(**args))
    assert message in error.details
    assert master.rendezvous.snapshot().joined == ()


def test_malformed_reports_are_invalid_argument(master: Master) -> None:
    round_ = form_round(master)
    with master.client() as client:
        bad: list[Callable[[], object]] = [
            lambda: client.get_rendezvous(round=round_, agent_id=""),
            lambda: client.heartbeat(round=round_, agent_id="agent-0", step=-1),
            lambda: client.heartbeat(round=round_, agent_id="agent-0", step=1, timestamp=float("inf")),
            lambda: client.report_node_check(
                round=round_, agent_id="agent-0", node_id="node-0", elapsed_s=-1.0, success=True
            ),
            lambda: client.report_node_check(
                round=round_, agent_id="agent-0", node_id="node-0", elapsed_s=float("nan"), success=True
            ),
            lambda: client.report_node_check(
                round=round_, agent_id="agent-0", node_id="", elapsed_s=1.0, success=True
            ),
            lambda: client.report_node_check(
                round=round_, agent_id="agent-0", node_id="node-0", elapsed_s=1.0, success=True, check_round=3
            ),
            lambda: client.report_failure(round=round_, agent_id="agent-0", local_rank=-2, exit_code=1),
            lambda: client.report_failure(
                round=round_, agent_id="agent-0", local_rank=0, exit_code=1, error="x" * 70_000
            ),
        ]
        for call in bad:
            expect_status(grpc.StatusCode.INVALID_ARGUMENT, call)
    assert not (master.hooks.heartbeats or master.hooks.node_checks or master.hooks.failures)


def test_server_survives_hook_errors_and_garbage(master: Master) -> None:
    round_ = form_round(master)
    with master.client() as client:
        master.hooks.heartbeat_error = KeyError("bug in the master")
        error = expect_status(
            grpc.StatusCode.INTERNAL, lambda: client.heartbeat(round=round_, agent_id="agent-0", step=1)
        )
        assert "KeyError" in error.details and "bug in the master" not in error.details

        master.hooks.heartbeat_error = None
        master.hooks.action = 42  # not an Action: the master's bug, not the agent's
        expect_status(
            grpc.StatusCode.INTERNAL, lambda: client.heartbeat(round=round_, agent_id="agent-0", step=1)
        )

        # bytes that are not a JoinRequest, and a method that does not exist
        channel = grpc.insecure_channel(master.server.address)
        raw = channel.unary_unary("/dlu.elastic.v1.ElasticService/JoinRendezvous")
        with pytest.raises(grpc.RpcError) as garbage:
            raw(b"\xff\xff\xff\xff not a protobuf", timeout=5)
        assert isinstance(garbage.value, grpc.Call)
        assert garbage.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "undecodable request" in (garbage.value.details() or "")
        unknown = channel.unary_unary("/dlu.elastic.v1.ElasticService/NoSuchMethod")
        with pytest.raises(grpc.RpcError) as missing:
            unknown(b"", timeout=5)
        assert isinstance(missing.value, grpc.Call)
        assert missing.value.code() == grpc.StatusCode.UNIMPLEMENTED
        channel.close()

        master.hooks.action = pb.ACTION_STOP
        assert client.heartbeat(round=round_, agent_id="agent-0", step=2) == pb.ACTION_STOP  # still serving


def test_serve_refuses_an_empty_token_and_a_taken_port(master: Master) -> None:
    servicer = ElasticServicer(Rendezvous(min_nodes=1, max_nodes=1))
    with pytest.raises(ValueError, match="token"):
        serve("127.0.0.1", 0, token="", servicer=servicer)
    with pytest.raises(OSError, match="cannot bind"):
        serve("127.0.0.1", master.server.port, token=TOKEN, servicer=servicer)


# -- deadlines ------------------------------------------------------------------------------


def test_calls_fail_fast_when_the_server_is_gone() -> None:
    master = start_master(min_nodes=1, max_nodes=1)
    address = master.server.address
    master.server.stop(0)
    # A deadline far beyond the test's: UNAVAILABLE (not DEADLINE_EXCEEDED) means it failed fast.
    with ElasticClient(address, TOKEN, timeout_s=600.0) as client:
        expect_status(grpc.StatusCode.UNAVAILABLE, lambda: finishes(lambda: client.join(**join_args(0))))
    # Waiting for the server instead, the call ends at its own deadline, not by failing fast.
    with ElasticClient(address, TOKEN, timeout_s=0.5, wait_for_ready=True) as client:
        expect_status(
            grpc.StatusCode.DEADLINE_EXCEEDED,
            lambda: finishes(lambda: client.heartbeat(round=1, agent_id="a", step=1)),
        )


@pytest.fixture
def black_hole() -> Iterator[str]:
    """A TCP port that accepts connections and never speaks HTTP/2: a hung master."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    accepted: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        listener.settimeout(0.1)
        while not stop.is_set():
            try:
                accepted.append(listener.accept()[0])
            except TimeoutError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield f"127.0.0.1:{listener.getsockname()[1]}"
    stop.set()
    thread.join(2)
    for conn in accepted:
        conn.close()
    listener.close()


def test_deadline_is_respected_by_a_hung_server(black_hole: str) -> None:
    with ElasticClient(black_hole, TOKEN, timeout_s=0.5) as client:
        expect_status(
            grpc.StatusCode.DEADLINE_EXCEEDED,
            lambda: finishes(lambda: client.get_rendezvous(round=1, agent_id="a")),
        )
        expect_status(
            grpc.StatusCode.DEADLINE_EXCEEDED,
            lambda: finishes(lambda: client.wait_rendezvous(round=1, agent_id="a", timeout_s=0.3)),
        )


def test_wait_rendezvous_gives_up_after_its_overall_timeout() -> None:
    master = start_master(min_nodes=2, max_nodes=2)
    try:
        with master.client() as client:
            joined = client.join(**join_args(0))
            error = expect_status(
                grpc.StatusCode.DEADLINE_EXCEEDED,
                lambda: finishes(
                    lambda: client.wait_rendezvous(
                        round=joined.round, agent_id="agent-0", poll_interval_s=0.05, timeout_s=0.4
                    )
                ),
            )
            assert "1 agents joined" in error.details
    finally:
        master.server.stop(0)


# -- held calls (long polls) -------------------------------------------------------------------


def test_a_held_join_is_the_whole_rendezvous_in_one_call() -> None:
    master = start_master(min_nodes=2, max_nodes=2)
    try:
        with master.client() as first, master.client() as second, ThreadPoolExecutor(1) as pool:
            held = pool.submit(first.join, **join_args(0), wait_s=10.0)
            wait_until("the join to be held", lambda: held_calls(master) == 1)
            assert not held.done()  # held: the round waits for its second agent
            other = second.join(**join_args(1), wait_s=10.0)
            answer = held.result(timeout=5)
    finally:
        master.server.stop(0)
    for response in (answer, other):
        assert response.accepted and response.state.complete
        assert response.state.world_size == 4 and response.state.round == response.round == 1
    assert {answer.state.group_rank, other.state.group_rank} == {0, 1}


def test_a_held_call_answers_incomplete_before_its_deadline() -> None:
    master = start_master(min_nodes=2, max_nodes=2)
    try:
        with master.client(timeout_s=5.0) as client:
            joined = client.join(**join_args(0), wait_s=0.3)
            assert joined.accepted and not joined.HasField("state")
        # the deadline wins over a longer wait: answered, not DEADLINE_EXCEEDED. ElasticClient
        # adds the wait to a held call's deadline, so the call is made here with a shorter one.
        with grpc.insecure_channel(master.server.address) as channel:
            stub = pb_grpc.ElasticServiceStub(channel)
            request = pb.GetRendezvousRequest(
                job_token=TOKEN, round=joined.round, agent_id="agent-0", wait_s=30.0
            )
            state = stub.GetRendezvous(request, timeout=1.0)
            assert not state.complete and state.joined_agents == 1
    finally:
        master.server.stop(0)


def test_a_held_join_completes_by_the_grace_period() -> None:
    """The grace period runs on the rendezvous's clock: held until that clock passes it, then
    complete with the one agent there is."""
    now = [1000.0]
    master = start_master(min_nodes=1, max_nodes=2, grace_s=5.0, clock=lambda: now[0])
    try:
        with master.client(timeout_s=60.0) as client, ThreadPoolExecutor(1) as pool:
            held = pool.submit(client.join, **join_args(0), wait_s=50.0)
            wait_until("the join to be held", lambda: held_calls(master) == 1)
            now[0] += 4.9
            master.rendezvous.refresh()
            assert not held.done() and not master.rendezvous.snapshot().complete  # still in its grace
            now[0] += 0.2
            joined = held.result(timeout=30)  # the server's ticker sees the grace run out
            assert joined.state.complete and joined.state.group_world_size == 1
    finally:
        master.server.stop(0)


def test_a_held_join_of_a_superseded_round_answers_at_once_and_a_rejoin_completes() -> None:
    """A failover opens a new round while ranks wait in the old one: their held joins must end
    then (not at their deadline), so that they join the new round right away."""
    master = start_master(min_nodes=2, max_nodes=2)
    try:
        with master.client(timeout_s=60.0) as first, master.client() as second, ThreadPoolExecutor(1) as pool:
            held = pool.submit(first.join, **join_args(0), wait_s=30.0)
            wait_until("the join to be held", lambda: held_calls(master) == 1)
            assert not held.done()
            master.rendezvous.new_round()
            answer = held.result(timeout=10)  # far inside the 30 s it asked to be held
            assert answer.accepted and not answer.state.complete and answer.round == 1
            again = pool.submit(first.rendezvous, **join_args(0), timeout_s=20.0)
            other = second.join(**join_args(1), wait_s=10.0)
            state = again.result(timeout=10)
    finally:
        master.server.stop(0)
    assert state.complete and state.round == other.state.round == 2


def test_a_held_poll_of_a_superseded_round_is_refused_as_stale() -> None:
    master = start_master(min_nodes=2, max_nodes=2)
    try:
        with master.client() as client:
            joined = client.join(**join_args(0))
            with ThreadPoolExecutor(1) as pool:
                held = pool.submit(client.get_rendezvous, round=joined.round, agent_id="agent-0", wait_s=10.0)
                wait_until("the poll to be held", lambda: held_calls(master) == 1)
                master.rendezvous.new_round()
                with pytest.raises(RendezvousError) as info:
                    held.result(timeout=5)
            assert info.value.code == grpc.StatusCode.FAILED_PRECONDITION
            assert "round 1" in info.value.details and "round 2" in info.value.details
    finally:
        master.server.stop(0)


@pytest.mark.parametrize("wait_s", [-1.0, float("nan"), float("inf")])
def test_a_bad_wait_is_invalid_argument(master: Master, wait_s: float) -> None:
    with master.client() as client:
        error = expect_status(
            grpc.StatusCode.INVALID_ARGUMENT, lambda: client.join(**join_args(0), wait_s=wait_s)
        )
        assert "wait_s" in error.details


def test_stopping_the_server_ends_held_calls() -> None:
    master = start_master(min_nodes=2, max_nodes=2)
    with master.client(timeout_s=5.0) as client, ThreadPoolExecutor(1) as pool:
        held = pool.submit(client.join, **join_args(0), wait_s=30.0)
        wait_until("the join to be held", lambda: held_calls(master) == 1)
        finishes(lambda: master.server.stop(0))  # it ends the held call, not waits for it
        master.server.stop(0)  # idempotent
        try:  # answered with what it had (the round incomplete), or cut off
            answer = held.result(timeout=10)
        except RendezvousError as exc:
            assert exc.code in (grpc.StatusCode.CANCELLED, grpc.StatusCode.UNAVAILABLE)
        else:
            assert answer.accepted and not answer.state.complete
