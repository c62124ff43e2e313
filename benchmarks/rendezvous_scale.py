"""One rendezvous round of N simulated agents over gRPC on loopback (DESIGN section 9: <= 2 s
for 10,000 agents).

The server is the real ElasticService (`dlu_elastic.rendezvous.service.serve`, gRPC's asyncio
server) in its own process, as the ElasticMaster runs in its own actor. The agents are clients in
this process (no torch) doing what `ElasticClient.rendezvous` does: a join that the master holds
until the round completes (`wait_s`), then, only if that answer had no assignment, held
GetRendezvous calls. Every agent makes its own calls; the figure is the time from the first join
to the moment the last agent holds its complete rank assignment; the ranks are then checked for
consistency.

The agents share a few HTTP/2 connections (CHANNELS) with concurrent calls on each. In a real
job every agent is its own process with its own connection, on its own node; here one process
simulates them all on the server's two cores, so the simulated clients must be cheap or they
measure themselves. Two kinds (`--client`):

- `h2` (default): `h2_grpc_client.H2Channel`, which puts each call on the wire as gRPC does
  (HEADERS with the method's path, content-type, te and grpc-timeout; one length-prefixed DATA
  message) and reads each answer's message: about 0.03 ms of CPU per call;
- `grpc`: gRPC's own asyncio client, about 0.1 ms of CPU per call (the first wave's figures).

The server answers both the same way (it cannot tell them apart). Garbage collection is off in
this process during a round: thousands of simulated agents' calls in one heap are this
simulation's, not an agent's, and a collection walking them is not the master's cost.

Each size runs three times in the same server process (a fresh rendezvous each time, after one
warm-up round) and prints the median: other work on this 2-core machine makes single runs noisy.

Usage: `uv run python benchmarks/rendezvous_scale.py [--client h2|grpc] [N ...]`
(default 1000 4000 10000).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import multiprocessing
import statistics
import time
from multiprocessing.connection import Connection

import grpc
from figures import figure
from h2_grpc_client import H2Channel

from dlu.elastic.v1 import elastic_pb2 as pb
from dlu.elastic.v1 import elastic_pb2_grpc as pb_grpc

TOKEN = "bench-token"
BUDGET_S = 2.0
BUDGET_N = 10_000
CHANNELS = 4  # agents share a few HTTP/2 connections, as many agents per client process would
CALL_TIMEOUT_S = 30.0
REPEATS = 3
HOLD_S = 5.0  # how long an agent asks the master to hold a call, as ElasticClient.LONG_POLL_S
SERVICE = "/dlu.elastic.v1.ElasticService"


def _server_main(conn: Connection) -> None:
    """Serve one fresh rendezvous per size the driver sends, until it sends 0."""
    from dlu_elastic.rendezvous.gc_policy import defer_full_collections
    from dlu_elastic.rendezvous.service import ElasticServicer, serve
    from dlu_elastic.rendezvous.state import Rendezvous

    defer_full_collections()  # as the ElasticMaster's actor does

    while n := conn.recv():
        servicer = ElasticServicer(Rendezvous(min_nodes=n, max_nodes=n))
        running = serve("127.0.0.1", 0, token=TOKEN, servicer=servicer)
        conn.send(running.port)
        conn.recv()  # the round is over
        running.stop(0)


def _join_request(i: int) -> pb.JoinRequest:
    return pb.JoinRequest(
        job_token=TOKEN,
        agent_id=f"agent-{i:05d}",
        node_id=f"node-{i:05d}",
        local_ranks=8,
        host=f"10.0.{i // 256}.{i % 256}",
        free_port=29500,
        wait_s=HOLD_S,
    )


def _get_request(i: int, round_: int) -> pb.GetRendezvousRequest:
    return pb.GetRendezvousRequest(job_token=TOKEN, round=round_, agent_id=f"agent-{i:05d}", wait_s=HOLD_S)


async def _grpc_agent(stub: pb_grpc.ElasticServiceStub, i: int) -> tuple[pb.RendezvousState, int]:
    joined = await stub.JoinRendezvous(_join_request(i), timeout=CALL_TIMEOUT_S)
    calls = 1
    state = joined.state
    while not state.complete:
        state = await stub.GetRendezvous(_get_request(i, joined.round), timeout=CALL_TIMEOUT_S)
        calls += 1
    return state, calls


async def _h2_agent(channel: H2Channel, i: int) -> tuple[pb.RendezvousState, int]:
    answer = await channel.unary(f"{SERVICE}/JoinRendezvous", _join_request(i).SerializeToString())
    joined = pb.JoinResponse.FromString(answer)
    calls = 1
    state = joined.state
    while not state.complete:
        answer = await channel.unary(
            f"{SERVICE}/GetRendezvous", _get_request(i, joined.round).SerializeToString()
        )
        state = pb.RendezvousState.FromString(answer)
        calls += 1
    return state, calls


async def _round(port: int, n: int, client: str) -> tuple[float, int]:
    if client == "h2":
        h2 = [await H2Channel.connect("127.0.0.1", port, CALL_TIMEOUT_S) for _ in range(CHANNELS)]
        agents = [_h2_agent(h2[i % CHANNELS], i) for i in range(n)]

        async def close() -> None:
            for channel in h2:
                channel.close()

    else:
        channels = [grpc.aio.insecure_channel(f"127.0.0.1:{port}") for _ in range(CHANNELS)]
        for channel in channels:
            await asyncio.wait_for(channel.channel_ready(), timeout=10)
        stubs = [pb_grpc.ElasticServiceStub(channel) for channel in channels]
        agents = [_grpc_agent(stubs[i % CHANNELS], i) for i in range(n)]

        async def close() -> None:
            for channel in channels:
                await channel.close()

    gc.collect()
    gc.disable()  # see the module docstring
    try:
        t0 = time.perf_counter()
        results = await asyncio.gather(*agents)
        elapsed = time.perf_counter() - t0
    finally:
        gc.enable()
        await close()
    _check(n, [state for state, _ in results])
    return elapsed, sum(calls for _, calls in results)


def _check(n: int, states: list[pb.RendezvousState]) -> None:
    """Every agent got a distinct group rank, node-major offsets and the same master."""
    assert sorted(s.group_rank for s in states) == list(range(n)), "group ranks are not 0..n-1"
    assert {s.world_size for s in states} == {8 * n}, "agents disagree on the world size"
    assert all(s.rank_offset == 8 * s.group_rank for s in states), "rank offsets are not node-major"
    assert len({(s.master_addr, s.master_port) for s in states}) == 1, "agents disagree on the master"


class ServerProcess:
    """The ElasticService in a child process, as the ElasticMaster runs in its own actor."""

    def __init__(self) -> None:
        ctx = multiprocessing.get_context("spawn")  # gRPC does not survive fork
        self._conn, child = ctx.Pipe()
        self._process = ctx.Process(target=_server_main, args=(child,), daemon=True)
        self._process.start()

    def round(self, n: int, client: str) -> tuple[float, int]:
        self._conn.send(n)
        if not self._conn.poll(60):
            raise RuntimeError("the rendezvous server did not start within 60 s")
        port: int = self._conn.recv()
        try:
            return asyncio.run(_round(port, n, client))
        finally:
            self._conn.send("done")

    def close(self) -> None:
        self._conn.send(0)
        self._process.join(10)
        if self._process.is_alive():
            self._process.kill()


def main(sizes: list[int], client: str = "h2", repeats: int = REPEATS) -> None:
    server = ServerProcess()
    medians: dict[int, float] = {}
    try:
        server.round(10, client)  # warm-up: first-call costs in both processes are not the figure
        for n in sizes:
            runs = [server.round(n, client) for _ in range(repeats)]
            times = sorted(elapsed for elapsed, _ in runs)
            medians[n] = statistics.median(times)
            calls = statistics.median(calls for _, calls in runs)
            print(
                f"rendezvous round, {n:>5} agents: {medians[n]:.3f} s median of {repeats} "
                f"(best {times[0]:.3f} s, worst {times[-1]:.3f} s; {calls / n:.2f} RPCs per agent; "
                f"{client} clients)",
                flush=True,
            )
    finally:
        server.close()
    if BUDGET_N in medians:
        verdict = "within" if medians[BUDGET_N] <= BUDGET_S else "OVER"
        print(
            f"rendezvous round of {BUDGET_N:,} agents: {medians[BUDGET_N]:.3f} s ({verdict} the {BUDGET_S:g} s budget)"
        )
    for n, value in medians.items():
        figure(
            f"rendezvous_{n}_agents",
            value,
            "s",
            BUDGET_S if n == BUDGET_N else None,
            label=f"rendezvous round of {n:,} simulated agents over gRPC",
        )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("sizes", nargs="*", type=int, default=[1000, 4000, 10_000])
    parser.add_argument("--client", choices=("h2", "grpc"), default="h2", help="simulated clients' kind")
    args = parser.parse_args()
    main(args.sizes, args.client)
