"""One rendezvous round of N simulated agents over gRPC on loopback (DESIGN section 9: <= 1 s
for 1,000 agents).

The server is the real ElasticService (`dlu_elastic.rendezvous.service.serve`, gRPC's asyncio
server) in its own process, as the ElasticMaster runs in its own actor. The agents are asyncio
gRPC clients in this process (no torch) doing what `ElasticClient.rendezvous` does: a join that
the master holds until the round completes (`wait_s`), then, only if that answer had no
assignment, held GetRendezvous calls. The figure is the time from the first join to the moment
the last agent holds its complete rank assignment; the ranks are then checked for consistency.

The agents share a few HTTP/2 connections (CHANNELS) with concurrent calls on each. In a real
job every agent is its own process with its own connection, on its own node; 1,000 connections
from one process here would mostly measure this client process's event loop. Both sides share
this machine's two cores with each other (and with whatever else runs), so the figure is
pessimistic: the server alone used about 0.55 ms of CPU per call when this was written.

Each size runs three times in the same server process (a fresh rendezvous each time, after one
warm-up round) and prints the median: other work on this 2-core machine makes single runs noisy.

Usage: `uv run python benchmarks/rendezvous_scale.py [N ...]` (default 100 1000 4000).
"""

from __future__ import annotations

import asyncio
import multiprocessing
import statistics
import sys
import time
from multiprocessing.connection import Connection

import grpc
from figures import figure

from dlu.elastic.v1 import elastic_pb2 as pb
from dlu.elastic.v1 import elastic_pb2_grpc as pb_grpc

TOKEN = "bench-token"
BUDGET_S = 1.0
BUDGET_N = 1000
CHANNELS = 4  # agents share a few HTTP/2 connections, as many agents per client process would
CALL_TIMEOUT_S = 30.0
REPEATS = 3
HOLD_S = 5.0  # how long an agent asks the master to hold a call, as ElasticClient.LONG_POLL_S


def _server_main(conn: Connection) -> None:
    """Serve one fresh rendezvous per size the driver sends, until it sends 0."""
    from dlu_elastic.rendezvous.service import ElasticServicer, serve
    from dlu_elastic.rendezvous.state import Rendezvous

    while n := conn.recv():
        servicer = ElasticServicer(Rendezvous(min_nodes=n, max_nodes=n))
        running = serve("127.0.0.1", 0, token=TOKEN, servicer=servicer)
        conn.send(running.port)
        conn.recv()  # the round is over
        running.stop(0)


async def _agent(stub: pb_grpc.ElasticServiceStub, i: int) -> tuple[pb.RendezvousState, int]:
    joined = await stub.JoinRendezvous(
        pb.JoinRequest(
            job_token=TOKEN,
            agent_id=f"agent-{i:05d}",
            node_id=f"node-{i:05d}",
            local_ranks=8,
            host=f"10.0.{i // 256}.{i % 256}",
            free_port=29500,
            wait_s=HOLD_S,
        ),
        timeout=CALL_TIMEOUT_S,
    )
    calls = 1
    state = joined.state
    while not state.complete:
        state = await stub.GetRendezvous(
            pb.GetRendezvousRequest(
                job_token=TOKEN, round=joined.round, agent_id=f"agent-{i:05d}", wait_s=HOLD_S
            ),
            timeout=CALL_TIMEOUT_S,
        )
        calls += 1
    return state, calls


async def _round(port: int, n: int) -> tuple[float, int]:
    channels = [grpc.aio.insecure_channel(f"127.0.0.1:{port}") for _ in range(CHANNELS)]
    try:
        for channel in channels:
            await asyncio.wait_for(channel.channel_ready(), timeout=10)
        stubs = [pb_grpc.ElasticServiceStub(channel) for channel in channels]
        t0 = time.perf_counter()
        results = await asyncio.gather(*(_agent(stubs[i % CHANNELS], i) for i in range(n)))
        elapsed = time.perf_counter() - t0
    finally:
        for channel in channels:
            await channel.close()
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

    def round(self, n: int) -> tuple[float, int]:
        self._conn.send(n)
        if not self._conn.poll(60):
            raise RuntimeError("the rendezvous server did not start within 60 s")
        port: int = self._conn.recv()
        try:
            return asyncio.run(_round(port, n))
        finally:
            self._conn.send("done")

    def close(self) -> None:
        self._conn.send(0)
        self._process.join(10)
        if self._process.is_alive():
            self._process.kill()


def main(sizes: list[int], repeats: int = REPEATS) -> None:
    server = ServerProcess()
    medians: dict[int, float] = {}
    try:
        server.round(10)  # warm-up: first-call costs in both processes are not the figure
        for n in sizes:
            runs = [server.round(n) for _ in range(repeats)]
            times = sorted(elapsed for elapsed, _ in runs)
            medians[n] = statistics.median(times)
            calls = statistics.median(calls for _, calls in runs)
            print(
                f"rendezvous round, {n:>5} agents: {medians[n]:.3f} s median of {repeats} "
                f"(best {times[0]:.3f} s, worst {times[-1]:.3f} s; {calls / n:.2f} RPCs per agent)",
                flush=True,
            )
    finally:
        server.close()
    if BUDGET_N in medians:
        verdict = "within" if medians[BUDGET_N] <= BUDGET_S else "OVER"
        print(
            f"rendezvous round of {BUDGET_N} agents: {medians[BUDGET_N]:.3f} s ({verdict} the {BUDGET_S:g} s budget)"
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
    main([int(arg) for arg in sys.argv[1:]] or [100, 1000, 4000])
