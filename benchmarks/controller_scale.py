"""PrimeManager at scale without Ray: 100, 1,000 and 10,000 simulated actors, 8 per node
(10,000 actors on 1,250 nodes; 100 actors sit 4 per node, as 8 does not divide 100). DESIGN section 9: one monitor pass with 10,000 actors <= 50 ms.

The cluster is `dlu_prime.testing.sim_scheduler.SimScheduler`: observations are built once and
reused, so its `poll` costs a dict comprehension (timed and printed on its own). Per size:

- monitor pass: `PrimeManager.monitor_once` with every actor healthy and heartbeating (poll +
  step tracking + the pure policy + nothing to apply), the job RUNNING;
- failure decision: `dlu_prime.master.monitor.assess` on observations with one dead actor (the
  manager's reaction to a failure is the failover ladder's, timed by the failover benchmark);
- state save: `PrimeManager.save` (serialize + compare-and-set) to the memory store, and to a
  private Redis server when `dlu_store_redis` can start one;
- memory: what tracemalloc sees allocated for the job's state document in memory plus the
  manager's step tracking, once RUNNING.

Then how each grows from 1,000 to 10,000 actors as an exponent (1.0 = linear): the check is
that it stays <= 1.15 (noise on this shared machine). 100 actors is printed for reference but
its fixed costs dominate, so the growth check starts at 1,000.

Usage: `uv run python benchmarks/controller_scale.py [--repeats 15] [--no-redis]`.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import math
import statistics
import time
import tracemalloc
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from figures import figure

from dlu_api.spec import spec_from_dict
from dlu_api.spec.models import JobSpec
from dlu_api.status import JobStage
from dlu_api.vocabulary import ActorStage
from dlu_prime.master.manager import PrimeManager, new_state
from dlu_prime.master.monitor import assess, track_steps
from dlu_prime.scheduler.base import ActorObservation
from dlu_prime.state import MemoryStateStore, StateStore
from dlu_prime.testing.sim_scheduler import SimScheduler

SIZES = (100, 1_000, 10_000)
PER_NODE = 8
BUDGET_MS = 50.0
LINEAR_EXPONENT = 1.15  # growth exponent from 1,000 to 10,000 actors still called linear
NOW = 1_000_000.0


class Clock:
    def __init__(self) -> None:
        self.now = NOW

    def __call__(self) -> float:
        return self.now


def per_node(actors: int) -> int:
    """8 actors per node; 4 when 8 does not divide the count (100 actors: 25 nodes)."""
    return PER_NODE if actors % PER_NODE == 0 else 4


def job_spec(actors: int) -> JobSpec:
    return spec_from_dict(
        {
            "name": f"bench-scale-{actors}",
            "device_type": "CPU",
            "device_per_node": 0,
            "roles": [
                {
                    "name": "worker",
                    "entrypoint": "pkg.worker:main",
                    "total": actors,
                    "per_group": per_node(actors),
                    "resources": {"cpu": 0.25},
                }
            ],
            "health": {"monitor_interval_s": 1.0, "heartbeat_timeout_s": 60, "hang_timeout_s": 600},
        }
    )


@dataclass
class Result:
    actors: int
    nodes: int
    poll_ms: float
    monitor_ms: float
    failure_ms: float
    save_ms: dict[str, float]
    doc_bytes: int
    memory_bytes: int


def timed(call: Callable[[], object], repeats: int) -> float:
    """Median milliseconds of `call` (garbage collection as in the real process, not disabled)."""
    samples: list[float] = []
    for _ in range(repeats):
        start = time.perf_counter()
        call()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples) * 1e3


def running_manager(spec: JobSpec, store: StateStore, clock: Clock) -> tuple[PrimeManager, SimScheduler]:
    names = list(new_state(spec).actors)
    sim = SimScheduler(spec, clock, names)
    manager = PrimeManager.create(spec, sim, store, clock=clock)
    manager.prepare()
    manager.start()
    assert manager.state.stage is JobStage.RUNNING, manager.state.reason
    return manager, sim


def state_memory(spec: JobSpec, observations: dict[str, ActorObservation]) -> int:
    """Bytes allocated for a RUNNING job's state plus the manager's step tracking."""
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        state = new_state(spec)
        for name, record in state.actors.items():
            record.stage = ActorStage.RUNNING
            record.node_id = observations[name].node_id
        steps = track_steps({}, observations, NOW)
        after = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    del state, steps
    return after - before


@contextlib.contextmanager
def redis_store(enabled: bool) -> Iterator[StateStore | None]:
    if not enabled:
        yield None
        return
    try:
        from dlu_store_redis.store import RedisStateStore
        from dlu_store_redis.testing import RedisServer

        server = RedisServer()
        server.start()
    except Exception as exc:  # no binary, no module: the figure is simply not measured
        print(f"(Redis not measured: {type(exc).__name__}: {exc})")
        yield None
        return
    try:
        with RedisStateStore(url=server.url, key_prefix="bench-scale") as store:
            yield store
    finally:
        server.close()


def measure(actors: int, repeats: int, redis: StateStore | None) -> Result:
    spec = job_spec(actors)
    clock = Clock()
    manager, sim = running_manager(spec, MemoryStateStore(), clock)
    sim.beat()
    names = list(manager.state.actors)
    poll_ms = timed(lambda: sim.poll(names), repeats)

    def healthy_pass() -> None:
        manager.monitor_once()

    manager.monitor_once()  # the first pass records node ids and steps: not the steady state
    monitor_ms = timed(healthy_pass, repeats)
    assert manager.state.stage is JobStage.RUNNING, manager.state.reason

    observations = sim.observations()
    victim = names[len(names) // 2]
    observations[victim] = ActorObservation.gone("actor died (simulated)")
    steps = track_steps({}, observations, clock.now)

    def failure_pass() -> None:
        found = assess(manager.state, observations, clock.now, steps)
        assert [f.actor for f in found.failures] == [victim]

    failure_ms = timed(failure_pass, repeats)

    save_ms = {"memory": timed(manager.save, repeats)}
    if redis is not None:
        remote = PrimeManager(manager.state, sim, redis, None, clock)
        save_ms["redis"] = timed(remote.save, repeats)
        redis.delete(spec.name)
    doc_bytes = len(manager.state.dumps())
    memory = state_memory(spec, sim.observations())
    return Result(
        actors=actors,
        nodes=actors // per_node(actors),
        poll_ms=poll_ms,
        monitor_ms=monitor_ms,
        failure_ms=failure_ms,
        save_ms=save_ms,
        doc_bytes=doc_bytes,
        memory_bytes=memory,
    )


def exponent(small: Result, large: Result, value: Callable[[Result], float]) -> float:
    """Growth exponent k in value ~ actors**k between two sizes (1.0 = linear)."""
    return math.log(value(large) / value(small)) / math.log(large.actors / small.actors)


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--repeats", type=int, default=15, help="timed runs per figure (median)")
    parser.add_argument("--no-redis", action="store_true", help="do not start a Redis server")
    args = parser.parse_args()

    results: list[Result] = []
    with redis_store(not args.no_redis) as redis:
        for actors in SIZES:
            results.append(measure(actors, args.repeats, redis))
            r = results[-1]
            saves = ", ".join(f"{store} {ms:.2f} ms" for store, ms in r.save_ms.items())
            print(
                f"{r.actors:>6} actors on {r.nodes:>5} nodes: monitor pass {r.monitor_ms:7.2f} ms "
                f"(sim poll {r.poll_ms:.2f} ms), failure decision {r.failure_ms:7.2f} ms, "
                f"save {saves}, state {r.doc_bytes / 1e6:.2f} MB stored / "
                f"{r.memory_bytes / 1e6:.2f} MB in memory",
                flush=True,
            )

    print(f"\nmedian of {args.repeats} runs each; per actor:")
    print(f"{'actors':>6} {'monitor us':>10} {'failure us':>10} {'save us':>8} {'memory B':>9} {'doc B':>7}")
    for r in results:
        print(
            f"{r.actors:>6} {r.monitor_ms * 1e3 / r.actors:>10.2f} {r.failure_ms * 1e3 / r.actors:>10.2f} "
            f"{r.save_ms['memory'] * 1e3 / r.actors:>8.2f} {r.memory_bytes / r.actors:>9.0f} "
            f"{r.doc_bytes / r.actors:>7.0f}"
        )
    mid, big = results[1], results[2]
    measures: dict[str, Callable[[Result], float]] = {
        "monitor pass": lambda r: r.monitor_ms,
        "failure decision": lambda r: r.failure_ms,
        "state save (memory)": lambda r: r.save_ms["memory"],
        "state memory": lambda r: float(r.memory_bytes),
    }
    if "redis" in big.save_ms:
        measures["state save (redis)"] = lambda r: r.save_ms["redis"]
    print(f"\ngrowth from {mid.actors:,} to {big.actors:,} actors (exponent; 1.00 = linear):")
    linear = True
    for what, value in measures.items():
        k = exponent(mid, big, value)
        ok = k <= LINEAR_EXPONENT
        linear = linear and ok
        print(f"  {what:<20} {k:5.2f}  {'linear or better' if ok else 'FASTER THAN LINEAR'}")
    verdict = "within" if big.monitor_ms <= BUDGET_MS else "OVER"
    print(
        f"monitor pass, {big.actors:,} actors: {big.monitor_ms:.2f} ms ({verdict} the {BUDGET_MS:g} ms budget)"
    )

    figure(
        "monitor_pass_10000",
        big.monitor_ms,
        "ms",
        BUDGET_MS,
        label="PrimeManager monitor pass, 10,000 simulated actors",
    )
    figure("failure_decision_10000", big.failure_ms, "ms", label="failure decision (assess), 10,000 actors")
    figure(
        "state_save_memory_10000",
        big.save_ms["memory"],
        "ms",
        label="state save, memory store, 10,000 actors",
    )
    if "redis" in big.save_ms:
        figure("state_save_redis_10000", big.save_ms["redis"], "ms", label="state save, Redis, 10,000 actors")
    figure(
        "state_memory_per_actor",
        big.memory_bytes / big.actors,
        "bytes",
        label="PrimeMaster state in memory per actor",
    )
    worst = max(exponent(mid, big, value) for value in measures.values())
    figure(
        "controller_growth_exponent",
        worst,
        "",
        LINEAR_EXPONENT,
        label="worst growth exponent 1k -> 10k actors (1 = linear)",
    )
    if not linear:
        print("some figure grows faster than linear")


if __name__ == "__main__":
    main()
