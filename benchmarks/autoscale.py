"""Auto-scaling, three cases (docs/autoscaling.md has the figures):

(a) an elastic job whose step takes compute / N + comm x (N - 1) at N nodes (fixed global batch:
    its best size is strictly inside MIN:MAX), auto-scaled single-job from where DLU starts it
    (MAX): the decisions, the size reached against the best, and the time taken;
(b) a worker role draining a bursty backlog: the worst queue delay against its target, and its
    actor-seconds against the best fixed size (the smallest whose worst delay meets the target);
(c) the job of (a) a second time in cluster mode with a real Brain (dlu-brain on a temporary
    SQLite file): the size it starts at, and when.

On the simulated scheduler and clock by default (the real PrimeManager, its decision core and the
real Brain; seconds are simulated). `--ray` runs (b) on a real local two-node Ray Cluster, and
(a) and (c) with `--case a` / `--case c` (an elastic role of 1:4 nodes whose step sleeps
1 s / N + 0.15 s x (N - 1); about 2.5 and 5 minutes).

    uv run python benchmarks/autoscale.py
    uv run python benchmarks/autoscale.py --ray
    uv run python benchmarks/autoscale.py --ray --case a --case c
    uv run python benchmarks/autoscale.py --case a --threshold 0.3 --threshold 0.5
"""

from __future__ import annotations

import argparse
import bisect
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from dlu_api.spec.autoscale_settings import AutoscaleSettings
from dlu_prime.testing.sim.autoscale_run import ELASTIC, WORKERS, AutoscaleSim, backlog_spec, elastic_spec
from dlu_prime.testing.sim.workloads import BurstyQueue, ElasticSteps, step_time

ROOT = Path(__file__).resolve().parents[1]
COMPUTE_S, COMM_S, LOW, HIGH = 1.0, 0.04, 1, 8
RATE, TARGET_S, MAX_WORKERS = 5.0, 30.0, 16
DEFAULT_THRESHOLD = AutoscaleSettings().marginal_threshold


def burst(t: float) -> float:
    """60 items/s for a minute every five minutes, 8 items/s between."""
    return 60.0 if (t % 300) < 60 else 8.0


def worst_delay(series: list[tuple[float, float, float]]) -> float:
    """The longest an item waited (FIFO): from the step it arrived to the step it was taken."""
    times = [t for t, _, _ in series]
    done = [d for _, _, d in series]
    worst = 0.0
    for t, arrived, _ in series:
        at = bisect.bisect_left(done, arrived - 1e-6)
        taken = times[at] if at < len(times) else float("inf")
        worst = max(worst, taken - t)
    return worst


def case_a(threshold: float, seconds: float = 1500, comm_s: float = COMM_S) -> dict[str, float | int | str]:
    speed = {n: 1 / step_time(n, COMPUTE_S, comm_s) for n in range(LOW, HIGH + 1)}
    best = max(speed, key=speed.__getitem__)
    sim = AutoscaleSim(elastic_spec(LOW, HIGH, threshold=threshold)).with_steps(
        ElasticSteps(ELASTIC, COMPUTE_S, comm_s)
    )
    trace = sim.run(seconds)
    reached = trace.sizes[-1][1]
    last = trace.decisions[-1][0] if trace.decisions else 0.0
    print(
        f"(a) threshold {threshold:.0%}: compute {COMPUTE_S:g} s / N + comm {comm_s:g} s x (N - 1), nnodes {LOW}:{HIGH}"
    )
    for t, message in trace.decisions:
        print(f"      t={t:5.0f}s  {message}")
    share = speed[reached] / speed[best]
    print(f"    reached {reached} nodes ({speed[reached]:.2f} steps/s) at t={last:.0f}s; best throughput "
          f"{best} nodes ({speed[best]:.2f} steps/s): {share:.0%} of it; {len(trace.decisions)} resizes")  # fmt: skip
    return {"threshold": threshold, "reached": reached, "best": best, "share": share, "time_s": last}


def case_b(seconds: float = 1200) -> dict[str, float]:
    queue = BurstyQueue("samples", WORKERS, RATE, burst)
    sim = AutoscaleSim(backlog_spec(2, MAX_WORKERS, target_s=TARGET_S)).with_queue(queue)
    series: list[tuple[float, float, float]] = []
    actor_s = 0.0
    while sim.clock() - sim.started < seconds:
        t = sim.clock() - sim.started
        sim.step()
        actor_s += sim.trace.sizes[-1][1]
        series.append((t, queue.arrived, queue.done))
    delay = worst_delay(series)
    fixed = {k: worst_delay(queue.fixed(k, seconds)) for k in range(1, MAX_WORKERS + 1)}
    best = min(k for k, d in fixed.items() if d <= TARGET_S)
    best_s = best * seconds
    print(f"(b) backlog role: {RATE:g} items/s per actor, bursts of 60/s for 60 s every 300 s (8/s between), "
          f"target {TARGET_S:g} s, 1:{MAX_WORKERS}")  # fmt: skip
    for t, message in sim.trace.decisions[:8]:
        print(f"      t={t:5.0f}s  {message}")
    print(f"      ... {len(sim.trace.decisions)} decisions in {seconds:g} s")
    print(f"    worst queue delay {delay:.0f} s (target {TARGET_S:g} s); {actor_s:.0f} actor-seconds; best fixed size "
          f"{best} (worst delay {fixed[best]:.0f} s): {best_s:.0f} actor-seconds; auto-scaled / fixed "
          f"{actor_s / best_s:.2f}")  # fmt: skip
    return {"delay_s": delay, "actor_s": actor_s, "fixed": best, "fixed_actor_s": best_s}


def case_c(seconds: float = 600) -> dict[str, float | int | str]:
    from dlu_brain import Brain, BrainDatabase, BrainServer
    from dlu_prime.brain_port import BrainClient
    from dlu_prime.master.state import SUB_MASTER_RANK

    server = BrainServer(Brain(BrainDatabase(f"sqlite:///{tempfile.mkdtemp()}/brain.sqlite")))
    server.serve_in_thread()
    runs: list[tuple[float, int, str]] = []
    try:
        for run in (1, 2):
            sim = AutoscaleSim(elastic_spec(LOW, HIGH, mode="cluster", brain_url=server.url, name="lm"))
            sim.autoscale.brain = BrainClient(server.url, clock=sim.clock)
            trace = sim.with_steps(ElasticSteps(ELASTIC, COMPUTE_S, COMM_S)).run(seconds)
            first = trace.decisions[0] if trace.decisions else (float("nan"), "none")
            settled = trace.sizes[-1][1]
            final = max((t for t, _ in trace.decisions), default=0.0)
            print(f"(c) run {run} with the Brain: first decision at t={first[0]:.0f}s: {first[1]}")
            print(f"    settled at {settled} nodes by t={final:.0f}s ({len(trace.decisions)} resizes)")
            runs.append((first[0], settled, first[1]))
            ranks = [n for n, a in sim.manager.state.actors.items() if a.rank != SUB_MASTER_RANK]
            sim.cluster.finish(ranks)
            for _ in range(10):
                sim.step()
    finally:
        server.shutdown()
        server.server_close()
    return {"first_t": runs[1][0], "size": runs[1][1], "run1_size": runs[0][1]}


RAY_SCRIPT = r"""
import json, sys, time
from pathlib import Path
from dlu_prime.ray_env import pin_loopback
import ray
from ray.cluster_utils import Cluster
from dlu_api.spec import spec_from_dict
from dlu_prime import launcher
from dlu_prime.naming import NAMESPACE

root, items = Path(sys.argv[1]), int(sys.argv[2])
with pin_loopback():
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 2, "include_dashboard": False,
                      "node_ip_address": "127.0.0.1"})
    cluster.add_node(num_cpus=2, node_ip_address="127.0.0.1")
    ray.init(address=cluster.address, namespace=NAMESPACE)
spec = spec_from_dict({
    "name": "autoscale-bench", "device_type": "CPU", "device_per_node": 0, "node_num": 2,
    "master": {"cpu": 0.1}, "health": {"monitor_interval_s": 0.5, "stall_timeout_s": None},
    "env": {"AUTOSCALE_ITEMS": str(items)},
    "roles": [
        {"name": "main", "entrypoint": "autoscale_workloads:produce", "resources": {"cpu": 0.25}},
        {"name": "prep", "entrypoint": "autoscale_workloads:drain", "resources": {"cpu": 0.25},
         "total": 1, "max_total": 4, "resizable": True, "is_driver": False},
    ],
    "autoscale": {"mode": "single-job", "backlog_roles": {"prep": "samples"}, "backlog_target_s": 10,
                  "settle_s": 2, "measure_s": 4},
})
started = time.monotonic()
final = launcher.run_job(spec, str(root / "tests" / "integration"))
print(json.dumps({"exit_code": final.exit_code, "wall_s": time.monotonic() - started,
                  "events": [[e.time, e.kind, e.message] for e in final.events]}))
ray.shutdown()
cluster.shutdown()
"""


RAY_A_SCRIPT = r"""
import json, sys, time
from pathlib import Path
from dlu_prime.ray_env import pin_loopback
import ray
from ray.cluster_utils import Cluster
from dlu_api.spec import spec_from_dict
from dlu_prime import launcher
from dlu_prime.naming import NAMESPACE

root, compute, comm, high, budget, runs, brain_url = (
    Path(sys.argv[1]), sys.argv[2], sys.argv[3], int(sys.argv[4]), float(sys.argv[5]), int(sys.argv[6]),
    sys.argv[7] or None)
with pin_loopback():
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 2, "include_dashboard": False,
                      "node_ip_address": "127.0.0.1"})
    cluster.add_node(num_cpus=2, node_ip_address="127.0.0.1")
    ray.init(address=cluster.address, namespace=NAMESPACE)
autoscale = {"mode": "cluster" if brain_url else "single-job", "settle_s": 3, "measure_s": 6}
if brain_url:
    autoscale["brain_url"] = brain_url
out = []
for run in range(runs):
    spec = spec_from_dict({
        "name": "autoscale-curve", "device_type": "CPU", "device_per_node": 0,
        "master": {"cpu": 0.1}, "health": {"monitor_interval_s": 0.5, "stall_timeout_s": None},
        "env": {"CURVE_COMPUTE_S": compute, "CURVE_COMM_S": comm, "CURVE_END": str(time.time() + budget)},
        "roles": [{"name": "train", "kind": "elastic", "entrypoint": "autoscale_workloads:curve",
                   "resources": {"cpu": 0.25}, "resizable": True,
                   "elastic": {"nnodes": f"1:{high}", "nproc_per_node": 1, "start_timeout_s": 20,
                               "node_check": {"enabled": False}}}],
        "autoscale": autoscale,
    })
    started = time.monotonic()
    final = launcher.run_job(spec, str(root / "tests" / "integration"))
    out.append({"exit_code": final.exit_code, "reason": final.reason, "wall_s": time.monotonic() - started,
                "events": [[e.time, e.kind, e.message] for e in final.events]})
print(json.dumps(out))
ray.shutdown()
cluster.shutdown()
"""


def _ray_script(script: str, *args: str, timeout_s: float = 900) -> object:
    sys.path.insert(0, str(ROOT / "tests"))
    from short_tmp import short_tmp_dir  # pyright: ignore[reportMissingImports]

    env = {**os.environ, "RAY_TMPDIR": short_tmp_dir("dlu-asb-")}
    done = subprocess.run([sys.executable, "-c", script, str(ROOT), *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout_s, check=False)  # fmt: skip
    if done.returncode != 0:
        print(done.stdout[-2000:], done.stderr[-3000:])
        raise SystemExit(1)
    return json.loads([line for line in done.stdout.splitlines() if line.startswith(("{", "["))][-1])


def _decisions(events: list[list[object]], t0: float) -> list[str]:
    return [
        f"      t={float(str(t)) - t0:5.1f}s  {kind}: {message}"
        for t, kind, message in events
        if str(kind).startswith(("autoscale", "resize_done"))
    ]


def _settled(events: list[list[object]]) -> tuple[int | None, float]:
    """The size the last resize left the role at, and when (from the resize_done messages)."""
    import re

    size, when = None, 0.0
    for t, kind, message in events:
        found = re.search(r"(?:world|resize) (\d+) -> (\d+)", str(message)) if kind == "resize_done" else None
        if found:
            size, when = int(found.group(2)), float(str(t))
    return size, when


def ray_case_a(compute_s: float = 1.0, comm_s: float = 0.15, high: int = 4, budget_s: float = 150.0) -> None:
    """(a) on a real two-node Ray Cluster: an elastic role of 1:`high` nodes (one rank each) whose
    step sleeps compute / N + comm x (N - 1), auto-scaled single-job from MAX for `budget_s`."""
    speed = {n: 1 / step_time(n, compute_s, comm_s) for n in range(1, high + 1)}
    best = max(speed, key=speed.__getitem__)
    runs = _ray_script(RAY_A_SCRIPT, str(compute_s), str(comm_s), str(high), str(budget_s), "1", "")
    (run,) = runs  # type: ignore[misc]
    events = run["events"]
    t0 = events[0][0]
    print(f"(a, Ray) compute {compute_s:g} s / N + comm {comm_s:g} s x (N - 1), nnodes 1:{high}, a real two-node "
          f"Cluster: exit {run['exit_code']} in {run['wall_s']:.0f} s")  # fmt: skip
    print("\n".join(_decisions(events, t0)))
    size, when = _settled(events)
    reached = size if size is not None else high
    print(f"    reached {reached} nodes ({speed[reached]:.2f} steps/s by the curve) at t={when - t0 if size else 0:.0f}s; "
          f"best {best} nodes ({speed[best]:.2f} steps/s): {speed[reached] / speed[best]:.0%} of it")  # fmt: skip


def ray_case_c(compute_s: float = 1.0, comm_s: float = 0.15, high: int = 4, budget_s: float = 150.0) -> None:
    """(c) on a real two-node Ray Cluster: the job of (a, Ray) twice in cluster mode with a real
    Brain in this process (a temporary SQLite file): the size and time of the second run's start."""
    from dlu_brain import Brain, BrainDatabase, BrainServer

    server = BrainServer(Brain(BrainDatabase(f"sqlite:///{tempfile.mkdtemp()}/brain.sqlite")))
    server.serve_in_thread()
    try:
        runs = _ray_script(
            RAY_A_SCRIPT, str(compute_s), str(comm_s), str(high), str(budget_s), "2", server.url
        )
    finally:
        server.shutdown()
        server.server_close()
    for number, run in enumerate(runs, start=1):  # type: ignore[arg-type]
        events = run["events"]
        starts = [e for e in events if e[1] == "job_created" or e[1] == "job_resumed"]
        t0 = starts[-1][0] if starts else events[0][0]
        mine = [e for e in events if e[0] >= t0]
        print(f"(c, Ray) run {number} with the Brain: exit {run['exit_code']} in {run['wall_s']:.0f} s")
        print("\n".join(_decisions(mine, t0)))
        size, when = _settled(mine)
        print(
            f"    settled at {size if size is not None else high} nodes by t={when - t0 if size else 0:.0f}s"
        )


def ray_case(items: int = 80) -> None:
    """(b) on a real two-node Ray Cluster: one burst of `items` items, half a second each."""
    sys.path.insert(0, str(ROOT / "tests"))
    from short_tmp import short_tmp_dir  # pyright: ignore[reportMissingImports]

    env = {**os.environ, "RAY_TMPDIR": short_tmp_dir("dlu-asb-")}
    done = subprocess.run([sys.executable, "-c", RAY_SCRIPT, str(ROOT), str(items)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600, check=False)  # fmt: skip
    if done.returncode != 0:
        print(done.stdout[-2000:], done.stderr[-3000:])
        raise SystemExit(1)
    result = json.loads([line for line in done.stdout.splitlines() if line.startswith("{")][-1])
    t0 = result["events"][0][0]
    print(
        f"(b, Ray) {items} items at 0.5 s each, a real two-node Cluster: exit {result['exit_code']} in {result['wall_s']:.0f} s"
    )
    for t, kind, message in result["events"]:
        if kind.startswith(("autoscale", "resize_done")):
            print(f"      t={t - t0:5.1f}s  {kind}: {message}")
    print(f"    one actor alone would take {items * 0.5:.0f} s")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--ray", action="store_true", help="on a real local Ray Cluster: (b), or the cases --case names"
    )
    parser.add_argument(
        "--case",
        action="append",
        choices=("a", "b", "c"),
        help="run only these cases (repeatable; default all)",
    )
    parser.add_argument(
        "--threshold",
        action="append",
        type=float,
        help=f"marginal_threshold(s) for (a) (repeatable; default the spec's {DEFAULT_THRESHOLD:g} and 0.7)",
    )
    parser.add_argument(
        "--comm",
        type=float,
        default=COMM_S,
        help=f"(a)'s communication cost per added node, s (default {COMM_S:g})",
    )
    args = parser.parse_args(argv)
    if args.ray:
        cases = set(args.case or ("b",))
        if "a" in cases:
            ray_case_a()
        if "b" in cases:
            ray_case()
        if "c" in cases:
            ray_case_c()
        return 0
    cases = set(args.case or ("a", "b", "c"))
    if "a" in cases:
        for threshold in args.threshold or sorted({DEFAULT_THRESHOLD, 0.7}):
            case_a(threshold, comm_s=args.comm)
    if "b" in cases:
        case_b()
    if "c" in cases:
        case_c()
    return 0


if __name__ == "__main__":
    sys.exit(main())
