"""What a PrimeMaster pays to save its state on every transition, per state store.

For a job of N simple actors (a realistic JobState: actors placed on nodes and running, a
timeline of events), 200 transitions are saved in a loop, each as the PrimeManager does it
(change, serialize, compare-and-set with the last token). Prints, per store and N:
save p50/p99 (serialize + put) and put p50/p99 alone; then the state size per actor, and the
time to load and parse the state of a job of 10,000 actors (what a recovering PrimeMaster does
first). The last line compares Redis's save p50 with the 2 ms budget per transition.

The embedded store needs Ray: a private local one is started (not counted). Redis is a
private server started from `dlu_store_redis.testing` unless `--redis-url` names one.

Ends with FIGURE lines (benchmarks/figures.py). `--stores memory,redis` leaves out the embedded
store (and so Ray), as `run_all.py --quick` does.

Usage: `uv run python benchmarks/state_store.py [--rounds 200] [--redis-url URL] [--stores ...]`.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager

from figures import figure

from dlu_api.spec import spec_from_dict
from dlu_api.vocabulary import ActorStage
from dlu_prime.master.manager import new_state
from dlu_prime.master.state import MAX_EVENTS, JobState
from dlu_prime.state import EmbeddedStateStore, MemoryStateStore, StateStore

BUDGET_MS = 2.0
SIZES = (8, 1000)
LOAD_ACTORS = 10_000
LOAD_RUNS = 10
EVENTS = MAX_EVENTS  # a long-running job: the bounded timeline is full, so sizes hold steady
NODES = 16


def job_state(actors: int) -> JobState:
    """A running job: every actor placed on one of NODES nodes, a full timeline of events."""
    spec = spec_from_dict(
        {
            "name": f"bench-state-{actors}",
            "device_type": "CPU",
            "device_per_node": 0,
            "roles": [
                {
                    "name": "worker",
                    "entrypoint": "examples.hello.workers:main",
                    "total": actors,
                    "resources": {"cpu": 0.25},
                }
            ],
        }
    )
    state = new_state(spec)
    nodes = [uuid.uuid4().hex + uuid.uuid4().hex[:24] for _ in range(NODES)]  # Ray node ids: 56 hex
    for n, record in enumerate(state.actors.values()):
        record.stage = ActorStage.RUNNING
        record.node_id = nodes[n % NODES]
    for n in range(EVENTS):
        state.record(
            "actor_started", f"actor {n} started", actor=f"bench.worker.{n}", node_id=nodes[n % NODES]
        )
    return state


def percentiles(samples: list[float]) -> tuple[float, float]:
    """(p50, p99) in milliseconds."""
    ordered = sorted(samples)
    p99 = ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))]
    return statistics.median(ordered) * 1e3, p99 * 1e3


def save_loop(store: StateStore, state: JobState, rounds: int) -> tuple[list[float], list[float]]:
    """Save `rounds` transitions like PrimeManager.save; (whole-save seconds, put seconds)."""
    job = f"{state.job}-{uuid.uuid4().hex[:8]}"
    names = list(state.actors)
    token: int | None = None
    saves: list[float] = []
    puts: list[float] = []
    for n in range(rounds):
        record = state.actors[names[n % len(names)]]
        record.stage = ActorStage.READY if record.stage is ActorStage.RUNNING else ActorStage.RUNNING
        record.restart_count += 1
        state.record("actor_restarted", f"actor {record.name} restarted", actor=record.name)
        t0 = time.perf_counter()
        state.updated_at = time.time()
        data = state.dumps()
        t1 = time.perf_counter()
        token = store.put(job, data, token)
        t2 = time.perf_counter()
        saves.append(t2 - t0)
        puts.append(t2 - t1)
    store.delete(job)
    return saves, puts


def load_time(store: StateStore, data: bytes, runs: int) -> tuple[float, float]:
    """Median seconds to get the document and to get + parse it."""
    job = f"bench-load-{uuid.uuid4().hex[:8]}"
    store.put(job, data, None)
    gets: list[float] = []
    totals: list[float] = []
    for _ in range(runs):
        t0 = time.perf_counter()
        stored = store.get(job)
        t1 = time.perf_counter()
        assert stored is not None
        JobState.loads(stored.data)
        t2 = time.perf_counter()
        gets.append(t1 - t0)
        totals.append(t2 - t0)
    store.delete(job)
    return statistics.median(gets), statistics.median(totals)


@contextmanager
def redis_store(url: str | None) -> Iterator[StateStore]:
    from dlu_store_redis.store import RedisStateStore
    from dlu_store_redis.testing import RedisServer

    prefix = f"bench-{uuid.uuid4().hex[:8]}"
    if url:
        with RedisStateStore(url=url, key_prefix=prefix) as store:
            yield store
        return
    with RedisServer() as server, RedisStateStore(url=server.url, key_prefix=prefix) as store:
        yield store


@contextmanager
def embedded_store() -> Iterator[StateStore]:
    import ray

    from dlu_prime.ray_env import init_local

    os.environ.setdefault("RAY_ENABLE_UV_RUN_RUNTIME_ENV", "0")
    init_local(num_cpus=2)
    try:
        yield EmbeddedStateStore(namespace=f"bench-{uuid.uuid4().hex[:8]}")
    finally:
        ray.shutdown()


@contextmanager
def memory_store() -> Iterator[StateStore]:
    yield MemoryStateStore()


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--rounds", type=int, default=200)
    parser.add_argument("--redis-url", default=None, help="an existing server (default: start one)")
    parser.add_argument(
        "--stores", default="memory,embedded,redis", help="comma-separated: memory, embedded, redis"
    )
    args = parser.parse_args()
    chosen = [name.strip() for name in args.stores.split(",") if name.strip()]

    sizes = {n: len(job_state(n).dumps()) for n in SIZES}
    big = job_state(LOAD_ACTORS).dumps()
    known: dict[str, Callable[[], AbstractContextManager[StateStore]]] = {
        "memory": memory_store,
        "embedded": embedded_store,
        "redis": lambda: redis_store(args.redis_url),
    }
    unknown = sorted(set(chosen) - set(known))
    if unknown:
        parser.error(f"unknown store(s) {', '.join(unknown)}; choose from {', '.join(known)}")
    stores = {name: known[name] for name in chosen}

    print(f"save per transition, {args.rounds} rounds, ms (save = serialize + put, as PrimeManager.save)")
    print(
        f"{'store':<9} {'actors':>6} {'bytes':>8} {'save p50':>9} {'save p99':>9} {'put p50':>8} {'put p99':>8}"
    )
    redis: dict[int, tuple[float, float]] = {}  # actors -> (save p50, put p50)
    loads: dict[str, tuple[float, float]] = {}
    for name, open_store in stores.items():
        with open_store() as store:
            for n in SIZES:
                saves, puts = save_loop(store, job_state(n), args.rounds)
                save50, save99 = percentiles(saves)
                put50, put99 = percentiles(puts)
                print(
                    f"{name:<9} {n:>6} {sizes[n]:>8} {save50:>9.3f} {save99:>9.3f} {put50:>8.3f} {put99:>8.3f}"
                )
                if name == "redis":
                    redis[n] = (save50, put50)
            loads[name] = load_time(store, big, LOAD_RUNS)

    small, large = min(SIZES), max(SIZES)
    per_actor = (sizes[large] - sizes[small]) / (large - small)
    print(f"state size per actor: {per_actor:.0f} bytes ({len(big) / 1e6:.2f} MB for {LOAD_ACTORS:,} actors)")
    for name, (get_s, total_s) in loads.items():
        print(
            f"load + parse, {LOAD_ACTORS:,} actors, {name}: {total_s * 1e3:.1f} ms "
            f"(get {get_s * 1e3:.1f} ms, parse {(total_s - get_s) * 1e3:.1f} ms)"
        )
    if redis:
        puts = ", ".join(f"{redis[n][1]:.3f} ms ({n} actors)" for n in SIZES)
        saves = ", ".join(f"{redis[n][0]:.3f} ms ({n} actors)" for n in SIZES)
        verdict = "within" if max(p for _, p in redis.values()) <= BUDGET_MS else "OVER"
        print(
            f"redis p50 vs the {BUDGET_MS:.0f} ms budget: put {puts}: {verdict}; "
            f"whole save with serialization {saves}"
        )
    figure("state_size_per_actor", per_actor, "bytes", 1024.0, label="state document size per actor")
    if redis:
        figure(
            "state_put_p50_redis",
            max(p for _, p in redis.values()),
            "ms",
            BUDGET_MS,
            label=f"state put per transition, Redis on loopback, p50 (worst of {SIZES[0]} and {SIZES[1]} actors)",
        )
        figure(
            "state_save_p50_redis_1000",
            redis[max(SIZES)][0],
            "ms",
            label=f"state save incl. serialization, Redis, p50, {max(SIZES)} actors",
        )


if __name__ == "__main__":
    main()
