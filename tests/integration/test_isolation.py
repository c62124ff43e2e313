"""Isolation scheduling on a two-node `ray.cluster_utils.Cluster`: the PrimeMaster on the node
that offers the master resource, every worker on the node that offers the worker resource."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from short_tmp import short_tmp_dir

pytestmark = [pytest.mark.ray, pytest.mark.timeout(240)]

HERE = Path(__file__).parent

SCRIPT = r"""
import json, sys, time, threading
from pathlib import Path
import ray
from ray.cluster_utils import Cluster
from dlu_api.spec import spec_from_dict
from dlu_prime import launcher
from dlu_prime.naming import NAMESPACE, master_name

out = Path(sys.argv[1])
from dlu_prime.ray_env import pin_loopback
with pin_loopback():  # every node and this driver stay on 127.0.0.1
  cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 2, "resources": {"dlu_head": 1},
                  "include_dashboard": False, "node_ip_address": "127.0.0.1"})
  worker_node = cluster.add_node(num_cpus=2, resources={"dlu_worker": 4}, node_ip_address="127.0.0.1")
  ray.init(address=cluster.address, namespace=NAMESPACE)
spec = spec_from_dict({
    "name": "iso", "device_type": "CPU", "device_per_node": 0,
    "config": {"out_dir": str(out), "hold_s": 2},
    "health": {"monitor_interval_s": 0.2},
    "master": {"cpu": 0.1, "isolation_resource": "dlu_head", "worker_isolation_resource": "dlu_worker"},
    "roles": [{"name": "worker", "entrypoint": "workloads:record_node", "total": 3, "resources": {"cpu": 0.1}}],
})
launcher.submit_job(spec, sys.argv[2])
master = ray.get_actor(master_name("iso"), namespace=NAMESPACE)
master_node = ray.get(master.ping.remote())["node_id"]
final = launcher.wait_job(spec)
workers = sorted(p.read_text() for p in out.glob("iso.worker.*.node"))
print(json.dumps({"exit_code": final.exit_code, "reason": final.reason, "master": master_node,
                  "workers": workers, "head": cluster.head_node.node_id, "worker_node": worker_node.node_id}))
ray.shutdown()
cluster.shutdown()
"""


def test_master_and_workers_land_on_their_isolation_nodes(tmp_path: Path) -> None:
    env = {**os.environ, "RAY_TMPDIR": short_tmp_dir("dlu-iso-")}
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(tmp_path), str(HERE)],
        cwd=HERE,
        env=env,
        capture_output=True,
        text=True,
        timeout=220,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    result = json.loads([line for line in done.stdout.splitlines() if line.startswith("{")][-1])
    assert result["exit_code"] == 0, result["reason"]
    assert result["master"] == result["head"]
    assert result["workers"] == [result["worker_node"]] * 3
