"""Flash checkpoints when a Ray node is lost (a real `ray.cluster_utils.Cluster`, all on
loopback): rank 1's node is removed after it saved step 8. With `replicas: 1` the job resumes
the committed step from the copy rank 0's agent keeps (source "replica", the very tensors
saved); with `replicas: 0` it resumes from the persisted copies, the steps lost reported."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from short_tmp import short_tmp_dir

from dlu_elastic.checkpoint import shm

pytestmark = [pytest.mark.ray, pytest.mark.slow, pytest.mark.timeout(700)]

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = r"""
import json, sys, time
from pathlib import Path
from dlu_prime.ray_env import pin_loopback
import ray
from ray.cluster_utils import Cluster
from dlu_api.spec import spec_from_dict
from dlu_prime import launcher
from dlu_prime.naming import NAMESPACE

root, out, steps = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3]
worker_args = {"num_cpus": 2, "resources": {"worker": 1}, "node_ip_address": "127.0.0.1"}
with pin_loopback():  # every node and this driver stay on 127.0.0.1
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 2, "include_dashboard": False,
                      "node_ip_address": "127.0.0.1"})
    for _ in range(3):  # two for the job, one spare for the lost node's rank
        cluster.add_node(**worker_args)
    ray.init(address=cluster.address, namespace=NAMESPACE)

def run(name, checkpoint):
    where = out / name
    where.mkdir()
    spec = spec_from_dict({
        "name": name, "device_type": "CPU", "device_per_node": 0, "node_num": 2,
        "placement_strategy": "STRICT_SPREAD",
        "master": {"cpu": 0.1, "worker_isolation_resource": "worker"},
        "health": {"monitor_interval_s": 0.2},
        "roles": [{"name": "trainer", "kind": "elastic", "entrypoint": "flash_workloads:train",
                   "resources": {"cpu": 0.25},
                   "env": {"OUT_DIR": str(where), "STEPS": steps, "STEP_SLEEP_S": "0.2"},
                   "elastic": {"nnodes": 2, "nproc_per_node": 1, "node_check": {"enabled": False},
                               "checkpoint": {**checkpoint, "dir": str(where / "durable")}}}],
    })
    launcher.submit_job(spec, str(root / "tests" / "integration"))
    deadline = time.monotonic() + 240
    def held():
        return sorted(p.name for p in Path("/dev/shm").glob(f"dlu-ckpt.*.{name}.*/replica-*"))
    wanted = 4 if checkpoint["replicas"] else 0  # each rank's two slots on its buddy, once it is up
    while (not (where / "saved-r1-s8").exists() or len(held()) < wanted) and time.monotonic() < deadline:
        time.sleep(0.05)
    kept = held()
    status = launcher.job_status(name)
    victim = [a for a in status.roles[0].actors if a.rank == 1][0].node_id
    node = [n for n in cluster.list_all_nodes() if n.node_id == victim][0]
    cluster.remove_node(node)
    final = launcher.wait_job(spec)
    cluster.add_node(**worker_args)  # a spare again for the next job
    cluster.wait_for_nodes()
    return {"exit_code": final.exit_code, "reason": final.reason, "removed": victim, "held": kept,
            "nodes": {a.rank: a.node_id for a in final.roles[0].actors if a.rank >= 0},
            "events": [[e.kind, e.message] for e in final.events]}

results = {"replica": run("flash-node-rep", {"persist_every": 1000, "replicas": 1}),
           "disk": run("flash-node-disk", {"persist_every": 2, "replicas": 0})}
print(json.dumps(results))
ray.shutdown()
cluster.shutdown()
"""


def starts(out: Path, rank: int) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (out / f"starts-r{rank}.jsonl").read_text().splitlines()]


def replicas_held(result: dict[str, Any]) -> list[str]:
    return result["held"]


def resumed(out: Path) -> list[dict[str, Any]]:
    """Each rank's second start (what load() gave it), checked against the checksum it saved."""
    second = [starts(out, rank)[-1] for rank in (0, 1)]
    assert len({s["step"] for s in second}) == 1, second  # every rank resumes the same step
    for rank, record in enumerate(second):
        assert record["source"] is not None, second  # load() found a committed step
        assert record["checksum"] == (out / f"sum-r{rank}-s{record['step']}.txt").read_text(), record
    return second


@pytest.mark.parametrize("steps", [24, pytest.param(40, marks=pytest.mark.soak)], ids=["short", "long"])
def test_a_lost_node_resumes_from_the_replica_or_from_disk(tmp_path: Path, steps: int) -> None:
    """The node goes once rank 1 saved step 8 (`short`: 16 steps before the job would end)."""
    # a lost node's folder waits out its grace (nobody adopts it): a short one keeps the test short
    env = {**os.environ, "RAY_TMPDIR": short_tmp_dir("dlu-fnl-"), shm.ADOPT_GRACE_ENV: "20"}
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(ROOT), str(tmp_path), str(steps)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=660,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    result = json.loads([line for line in done.stdout.splitlines() if line.startswith("{")][-1])

    rep = result["replica"]
    assert rep["exit_code"] == 0, rep["reason"]
    assert rep["nodes"]["1"] != rep["removed"]  # rank 1 runs on another node now
    assert sorted(replicas_held(rep)) == ["replica-0-0", "replica-0-1", "replica-1-0", "replica-1-1"], rep
    second = [starts(tmp_path / "flash-node-rep", rank)[-1] for rank in (0, 1)]
    assert [s["source"] for s in second] == ["memory", "replica"], (second, rep)
    resumed(tmp_path / "flash-node-rep")
    step = second[0]["step"]
    assert step >= 7, second  # at most the step under way when the node went (nothing on disk)
    restored = [m for kind, m in rep["events"] if kind == "checkpoint_restored"]
    assert len(restored) == 1 and restored[0].startswith(f"resumed step {step} from replica"), restored

    disk = result["disk"]
    assert disk["exit_code"] == 0, disk["reason"]
    second = resumed(tmp_path / "flash-node-disk")
    assert [s["source"] for s in second] == ["disk", "disk"], second
    step = second[0]["step"]
    assert step % 2 == 0 and step >= 2, second
    restored = [m for kind, m in disk["events"] if kind == "checkpoint_restored"]
    said = (
        f"resumed step {step} from disk (rank 1 had no step in memory or in a buddy's replica); steps lost: "
    )
    assert len(restored) == 1 and restored[0].startswith(said), restored
    assert int(restored[0].rsplit(" ", 1)[1]) >= 8 - step  # rank 1 had saved step 8
    deadline = time.monotonic() + 30 + 20  # a lost node's folder waits out its grace (20 s here)
    while list(Path("/dev/shm").glob("dlu-ckpt.*.flash-node-*")) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not list(Path("/dev/shm").glob("dlu-ckpt.*.flash-node-*"))
