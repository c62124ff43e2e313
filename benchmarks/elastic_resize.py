"""Elastic resize times on a `ray.cluster_utils.Cluster` (all on loopback): an elastic role with
nnodes NODES-1:NODES (default 1:2; NPROC ranks per node, one Ray node per role node), CPU and gloo, training steps of
an allreduce (tests/integration/elastic_resize_workload.py).

- shrink: a node removed from the cluster -> the surviving ranks training again at the smaller
  world (their step log shows it), with the number of actor restarts on the surviving node;
  also the resize alone (the node found lost -> training again: the `resize_done` duration);
- grow: a node added (`add_node` returns once Ray lists it) -> training at the larger world, and
  the resize alone (its placement group placed -> training). Ray may place the role's pending
  group before `add_node` returns, so the first figure can be below the second.

Each is measured RUNS times (median printed as the FIGURE). Ray marks a removed node dead after
its health checks fail (here 0.5 s x 4), which the shrink-from-removal figure includes.
Usage: `uv run python benchmarks/elastic_resize.py [--runs 3] [--nproc 1] [--nodes 2]`
(`--nodes 3 --nproc 2`: the 3 nodes x 2 ranks of DESIGN's table, shrinking to 2 and growing back).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from figures import figure

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
# DESIGN's table (docs/performance.md): node removed -> training again; node added -> training.
BUDGETS = {"shrink": 2.0, "grow": 5.0}

SCRIPT = r"""
import json, sys, time
from pathlib import Path
from dlu_prime.ray_env import pin_loopback
import ray
from ray.cluster_utils import Cluster
from dlu_api.spec import spec_from_dict
from dlu_prime import launcher
from dlu_prime.naming import NAMESPACE

root, out, runs, nproc, top = Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
with pin_loopback():
    cluster = Cluster(initialize_head=True, head_node_args={
        "num_cpus": 2, "include_dashboard": False, "node_ip_address": "127.0.0.1",
        "_system_config": {"health_check_period_ms": 500, "health_check_failure_threshold": 4}})
    ray.init(address=cluster.address, namespace=NAMESPACE)
node_args = {"num_cpus": 2, "resources": {"slot": 1}, "node_ip_address": "127.0.0.1"}
for _ in range(top - 1):
    cluster.add_node(**node_args)
spec = spec_from_dict({
    "name": "bench-elastic", "device_type": "CPU", "device_per_node": 0, "node_num": top,
    "master": {"cpu": 0.1}, "health": {"monitor_interval_s": 0.1},
    "roles": [{"name": "trainer", "kind": "elastic", "entrypoint": "elastic_resize_workload:train",
               "resources": {"cpu": 0.1, "custom": {"slot": 1.0 / nproc}},
               "env": {"OUT_DIR": str(out), "STEP_S": "0.05"},
               "elastic": {"nnodes": f"{top - 1}:{top}", "nproc_per_node": nproc, "start_timeout_s": 5,
                           "replace_timeout_s": 5, "resize_interval_s": 0,
                           "node_check": {"enabled": False}}}],
})
launcher.submit_job(spec, str(root / "tests" / "integration"))

def rows():
    log = out / "steps.log"
    found = [line.split() for line in log.read_text().splitlines()] if log.exists() else []
    return [(int(r[0]), int(r[1]), float(r[4])) for r in found if len(r) >= 5]

def first_at(world, after):
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        hit = [r for r in rows() if r[1] == world and r[2] > after]
        if hit:
            return hit[0][2]
        time.sleep(0.02)
    raise SystemExit(f"no step at world {world} within 120s")

def resize_durations():
    status = launcher.job_status(spec.name, events=500)
    return [(e.message, e.duration_s) for e in status.events if e.kind == "resize_done"]

def pids():
    status = launcher.job_status(spec.name)
    out = {}
    for actor in status.roles[0].actors:
        if actor.rank >= 0 and actor.rank < nproc * (top - 1):
            out[actor.name] = ray.get(ray.get_actor(actor.name, namespace=NAMESPACE).status.remote())["pid"]
    return out

small, large = nproc * (top - 1), nproc * top
first_at(small, 0)
results = {"grow": [], "grow_resize": [], "shrink": [], "shrink_resize": [], "survivor_restarts": []}
for run in range(runs):
    node = cluster.add_node(**node_args)  # returns once Ray lists the node
    registered = time.time()
    results["grow"].append(first_at(large, registered) - registered)
    results["grow_resize"].append(resize_durations()[-1][1])
    before = pids()
    time.sleep(1.0)
    removed = time.time()
    cluster.remove_node(node)
    results["shrink"].append(first_at(small, removed) - removed)
    results["shrink_resize"].append(resize_durations()[-1][1])
    results["survivor_restarts"].append(sum(1 for name, pid in pids().items() if before.get(name) != pid))
    time.sleep(0.5)
(out / "finish").write_text("")
final = launcher.wait_job(spec)
results["exit_code"] = final.exit_code
results["counted_restarts"] = final.roles[0].restart_count + final.roles[0].inplace_restart_count
print("RESULTS " + json.dumps(results))
ray.shutdown()
cluster.shutdown()
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--nproc", type=int, default=1)
    parser.add_argument(
        "--nodes", type=int, default=2, help="MAX nodes of the role (nnodes NODES-1:NODES), one Ray node each"
    )
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="dlu-bench-er-") as out:
        env = {"RAY_TMPDIR": tempfile.mkdtemp(prefix="dlu-ber-", dir="/tmp")}
        done = subprocess.run(
            [sys.executable, "-c", SCRIPT, str(ROOT), out, str(args.runs), str(args.nproc), str(args.nodes)],
            cwd=ROOT,
            env={**os.environ, **env},
            capture_output=True,
            text=True,
            timeout=900,
            check=False,
        )
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULTS ")]
    if done.returncode != 0 or not lines:
        print(done.stdout[-2000:], done.stderr[-4000:], file=sys.stderr)
        raise SystemExit(2)
    results = json.loads(lines[-1].removeprefix("RESULTS "))
    for key in ("grow", "grow_resize", "shrink", "shrink_resize", "survivor_restarts"):
        print(f"{key}: {', '.join(f'{v:.2f}' for v in results[key])}")
    print(f"job exit code {results['exit_code']}, restarts counted {results['counted_restarts']}")
    label = f"{args.nodes - 1}<->{args.nodes} nodes x {args.nproc} rank(s), median of {args.runs}"
    figure(
        "elastic_grow",
        statistics.median(results["grow"]),
        "s",
        BUDGETS["grow"],
        f"node added (Ray lists it) -> training at the larger world ({label})",
    )
    figure(
        "elastic_grow_resize",
        statistics.median(results["grow_resize"]),
        "s",
        None,
        f"growth decided -> training ({label})",
    )
    figure(
        "elastic_shrink",
        statistics.median(results["shrink"]),
        "s",
        None,
        f"node removed -> training at the smaller world, incl. Ray's dead-node detection ({label})",
    )
    figure(
        "elastic_shrink_resize",
        statistics.median(results["shrink_resize"]),
        "s",
        BUDGETS["shrink"],
        f"node found lost -> training at the smaller world ({label})",
    )
    figure(
        "elastic_survivor_restarts",
        float(max(results["survivor_restarts"])),
        "actors",
        0.0,
        "actor restarts on the surviving node (max over runs)",
    )


if __name__ == "__main__":
    main()
