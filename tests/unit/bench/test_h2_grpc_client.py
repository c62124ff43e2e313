"""The rendezvous benchmark's cheap HTTP/2 gRPC client against the real ElasticService on
loopback: a round completes with consistent ranks, refusals fail the call instead of counting as
answers, and more request bytes than the server's initial flow-control window still get through."""

from __future__ import annotations

import asyncio
import importlib
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

from dlu.elastic.v1 import elastic_pb2 as pb
from dlu_elastic.rendezvous.service import ElasticServicer, RunningServer, serve
from dlu_elastic.rendezvous.state import Rendezvous

pytestmark = pytest.mark.timeout(60)

BENCHMARKS = Path(__file__).resolve().parents[3] / "benchmarks"
TOKEN = "test-token"
JOIN = "/dlu.elastic.v1.ElasticService/JoinRendezvous"


@pytest.fixture
def h2() -> Iterator[ModuleType]:
    sys.path.insert(0, str(BENCHMARKS))
    try:
        yield importlib.import_module("h2_grpc_client")
    finally:
        sys.path.remove(str(BENCHMARKS))


def server(n: int) -> RunningServer:
    return serve("127.0.0.1", 0, token=TOKEN, servicer=ElasticServicer(Rendezvous(min_nodes=n, max_nodes=n)))


def join(i: int, token: str = TOKEN, wait_s: float = 20.0, padding: int = 0) -> bytes:
    return pb.JoinRequest(
        job_token=token,
        agent_id=f"agent-{i:05d}" + "x" * padding,
        node_id=f"node-{i:05d}",
        local_ranks=2,
        host="10.0.0.1",
        free_port=29500 + i % 1000,
        wait_s=wait_s,
    ).SerializeToString()


def test_a_round_of_held_joins_completes_with_consistent_ranks(h2: ModuleType) -> None:
    n = 300

    async def main(port: int) -> list[pb.JoinResponse]:
        channels = [await h2.H2Channel.connect("127.0.0.1", port, 30.0) for _ in range(2)]
        try:
            answers = await asyncio.gather(*(channels[i % 2].unary(JOIN, join(i)) for i in range(n)))
        finally:
            for channel in channels:
                channel.close()
        return [pb.JoinResponse.FromString(answer) for answer in answers]

    with server(n) as running:
        responses = asyncio.run(main(running.port))
    assert all(r.accepted and r.state.complete for r in responses)
    assert sorted(r.state.group_rank for r in responses) == list(range(n))
    assert {r.state.world_size for r in responses} == {2 * n}


def test_refused_and_unknown_calls_fail_instead_of_answering(h2: ModuleType) -> None:
    async def main(port: int) -> None:
        channel = await h2.H2Channel.connect("127.0.0.1", port, 30.0)
        try:
            with pytest.raises(h2.H2CallError, match="without exactly one"):
                await channel.unary(JOIN, join(0, token="wrong"))  # UNAUTHENTICATED: headers only
            with pytest.raises(h2.H2CallError):
                await channel.unary("/dlu.elastic.v1.ElasticService/NoSuchMethod", b"")
            with pytest.raises(h2.H2CallError):
                await channel.unary(JOIN, b"\xff\xff not a protobuf")  # INVALID_ARGUMENT
            answer = pb.JoinResponse.FromString(await channel.unary(JOIN, join(0, wait_s=0.0)))
            assert answer.accepted and not answer.state.complete  # the channel still works
        finally:
            channel.close()

    with server(2) as running:
        asyncio.run(main(running.port))


def test_more_request_bytes_than_the_servers_window_get_through(h2: ModuleType) -> None:
    # 120 failure reports of 50 KB: 6 MB, more than the 4 MiB connection window the server grants,
    # so the client must wait for its WINDOW_UPDATEs; each call is answered (refused: no member)
    report = pb.FailureReport(job_token=TOKEN, round=1, agent_id="a", error="e" * 50_000).SerializeToString()

    async def main(port: int) -> tuple[list[BaseException | bytes], int]:
        channel = await h2.H2Channel.connect("127.0.0.1", port, 30.0)
        try:
            calls = [
                channel.unary("/dlu.elastic.v1.ElasticService/ReportFailure", report) for _ in range(120)
            ]
            return await asyncio.gather(*calls, return_exceptions=True), channel.window_waits
        finally:
            channel.close()

    with server(2) as running:
        answers, waits = asyncio.run(main(running.port))
    assert len(answers) == 120
    # FAILED_PRECONDITION (headers only), not a reset or GOAWAY: the bytes arrived as sent
    assert all(isinstance(a, h2.H2CallError) and "without exactly one" in str(a) for a in answers)
    assert waits > 0  # the window really ran out on the way


def test_a_lost_connection_fails_the_calls_in_flight(h2: ModuleType) -> None:
    async def main(running: RunningServer) -> None:
        channel = await h2.H2Channel.connect("127.0.0.1", running.port, 30.0)
        held = asyncio.ensure_future(channel.unary(JOIN, join(0)))  # held: the round needs 2
        await asyncio.sleep(0.2)
        await asyncio.get_running_loop().run_in_executor(None, running.stop, 0)
        with pytest.raises(h2.H2CallError):
            await asyncio.wait_for(held, timeout=20)

    with server(2) as running:
        asyncio.run(main(running))
