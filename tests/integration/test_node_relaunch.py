"""Tier 4 on a real multi-node `ray.cluster_utils.Cluster`: a rank's actor is killed twice on
one node (per_node_max_failure=1), the node is handed to the job's Extension (loaded by
'module:Class'), which removes it from the cluster and adds a fresh node; the node's actors are
restarted on the new node, the counters follow the seed, and training finishes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from short_tmp import short_tmp_dir

pytestmark = [pytest.mark.ray, pytest.mark.slow, pytest.mark.timeout(600)]

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = r"""
import json, os, queue, signal, sys, threading, time
from multiprocessing.connection import Listener
from pathlib import Path
from dlu_prime.ray_env import pin_loopback
import ray
from ray.cluster_utils import Cluster
from dlu_api.spec import spec_from_dict
from dlu_prime import launcher
from dlu_prime.naming import NAMESPACE
sys.path.insert(0, sys.argv[1] + "/tests/integration")
from failover_ext import AUTHKEY

root, out = Path(sys.argv[1]), Path(sys.argv[2])
worker_args = {"num_cpus": 2, "resources": {"worker": 1}, "node_ip_address": "127.0.0.1"}
with pin_loopback():  # every node and this driver stay on 127.0.0.1
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 2, "include_dashboard": False,
                      "node_ip_address": "127.0.0.1"})
    nodes = [cluster.add_node(**worker_args) for _ in range(2)]
    ray.init(address=cluster.address, namespace=NAMESPACE)
swaps = []

requests = queue.Queue()

def serve(listener):
    # Ray adds nodes only from the main thread: hand each request over and wait for the answer.
    while True:
        with listener.accept() as conn:
            answer = queue.Queue()
            requests.put((conn.recv(), answer))
            conn.send(answer.get())

def swap_nodes():
    while not requests.empty():
        wanted, answer = requests.get()
        replaced = []
        try:
            for node_id in wanted:
                found = [n for n in cluster.list_all_nodes() if n.node_id == node_id]
                if not found:
                    raise LookupError(f"no node {node_id}")
                cluster.remove_node(found[0])
                new = cluster.add_node(**worker_args)
                cluster.wait_for_nodes()
                swaps.append([node_id, new.node_id])
                replaced.append(new.node_id)
        except Exception:
            import traceback
            answer.put(traceback.format_exc())
        else:
            answer.put(replaced)

listener = Listener(("127.0.0.1", 0), authkey=AUTHKEY)
threading.Thread(target=serve, args=(listener,), daemon=True).start()
host, port = listener.address
spec = spec_from_dict({
    "name": "relaunch", "device_type": "CPU", "device_per_node": 0, "node_num": 2,
    "placement_strategy": "STRICT_SPREAD",
    "master": {"cpu": 0.1, "worker_isolation_resource": "worker"},
    "health": {"monitor_interval_s": 0.2},
    "extension": "failover_ext:ClusterRelaunch",
    "config": {"node_ctl": f"{host}:{port}"},
    "roles": [{"name": "trainer", "kind": "elastic", "per_node_max_failure": 1,
               "entrypoint": f"{root}/examples/elastic/train_lm.py --steps 60 --step-seconds 0.1 --checkpoint-dir {out}",
               "resources": {"cpu": 0.25},
               "elastic": {"nnodes": 2, "nproc_per_node": 1, "node_check": {"enabled": False}}}],
})
launcher.submit_job(spec, str(root / "tests" / "integration"))
victim = "relaunch.trainer.1"

def step():
    status = launcher.job_status(spec.name)
    actor = [a for a in status.roles[0].actors if a.name == victim][0]
    return actor.step or -1, actor.node_id

def wait_step(at):
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline:
        swap_nodes()
        try:
            if step()[0] >= at:
                return
        except Exception:
            pass
        time.sleep(0.2)
    raise SystemExit(f"no step {at}")

def kill():
    # A read: asked again while Ray reports the actor temporarily unavailable (a restart's gap).
    deadline = time.monotonic() + 60
    while True:
        try:
            pid = ray.get(ray.get_actor(victim, namespace=NAMESPACE).status.remote(), timeout=30)["pid"]
            break
        except ray.exceptions.ActorUnavailableError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)
    os.kill(int(pid), signal.SIGKILL)

wait_step(5)
first_node = step()[1]
kill()
wait_step(12)
kill()
deadline = time.monotonic() + 400
while time.monotonic() < deadline:
    swap_nodes()
    current = launcher.job_status(spec.name)
    if current is None or current.stage.value == "STOPPED":
        break
    time.sleep(0.2)
final = launcher.wait_job(spec)
actors = {a.name: a for a in final.roles[0].actors}
print(json.dumps({
    "exit_code": final.exit_code, "reason": final.reason,
    "node_restart_count": final.node_restart_count, "removed_nodes": final.removed_nodes,
    "first_node": first_node, "victim_node": actors[victim].node_id,
    "victim_restarts": actors[victim].restart_count, "swaps": swaps,
    "events": [[e.kind, e.tier, e.message] for e in final.events],
    "loss": (out / "final_loss.txt").read_text() if (out / "final_loss.txt").exists() else None,
}))
ray.shutdown()
cluster.shutdown()
"""


def test_node_relaunch_replaces_a_cluster_node_and_training_finishes(tmp_path: Path) -> None:
    env = {**os.environ, "RAY_TMPDIR": short_tmp_dir("dlu-rl-")}
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(ROOT), str(tmp_path)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=560,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    # The last JSON line: Ray may forward a worker's death notice to stdout after it.
    result = json.loads([line for line in done.stdout.splitlines() if line.startswith("{")][-1])
    assert result["exit_code"] == 0, result["reason"]
    assert result["node_restart_count"] == 1
    assert result["removed_nodes"] == [result["first_node"]]
    assert [swap[0] for swap in result["swaps"]] == [result["first_node"]]
    assert result["victim_node"] == result["swaps"][0][1]  # restarted on the new node
    kinds = [e[0] for e in result["events"]]
    assert kinds.count("node_relaunch") == 1 and kinds.count("node_relaunched") == 1
    assert result["loss"] is not None
