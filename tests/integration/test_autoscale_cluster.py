"""Auto-scaling on a real two-node `ray.cluster_utils.Cluster` (all on loopback): a backlog role
with autoscale single-job grows to its backlog, its statistics (speed per size, the actors' CPU
and memory, the channel's backlog) show in the status, and the decision is an event with its
inputs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from short_tmp import short_tmp_dir

pytestmark = [pytest.mark.ray, pytest.mark.slow, pytest.mark.timeout(400)]

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = r"""
import json, sys
from pathlib import Path
from dlu_prime.ray_env import pin_loopback
import ray
from ray.cluster_utils import Cluster
from dlu_api.spec import spec_from_dict
from dlu_prime import launcher
from dlu_prime.naming import NAMESPACE

root = Path(sys.argv[1])
with pin_loopback():
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 2, "include_dashboard": False,
                      "node_ip_address": "127.0.0.1"})
    cluster.add_node(num_cpus=2, node_ip_address="127.0.0.1")
    ray.init(address=cluster.address, namespace=NAMESPACE)
spec = spec_from_dict({
    "name": "autoscale-it", "device_type": "CPU", "device_per_node": 0, "node_num": 2,
    "master": {"cpu": 0.1}, "health": {"monitor_interval_s": 0.5, "stall_timeout_s": None},
    "roles": [
        {"name": "main", "entrypoint": "autoscale_workloads:produce", "resources": {"cpu": 0.25}},
        {"name": "prep", "entrypoint": "autoscale_workloads:drain", "resources": {"cpu": 0.25},
         "total": 1, "max_total": 3, "resizable": True, "is_driver": False},
    ],
    "autoscale": {"mode": "single-job", "backlog_roles": {"prep": "samples"}, "backlog_target_s": 5,
                  "settle_s": 2, "measure_s": 4},
})
seen = {"throughput": {}, "usage": {}, "backlogs": {}}
def watch(status):
    for role, speeds in status.throughput.items():
        seen["throughput"][role] = [[t.world_size, t.steps_per_s] for t in speeds]
    for role in status.roles:
        for actor in role.actors:
            if actor.memory_bytes is not None:
                seen["usage"][actor.name] = [actor.cpu_percent, actor.memory_bytes]
    for name, count in status.backlogs.items():
        seen["backlogs"].setdefault(name, []).append(count)
final = launcher.run_job(spec, str(root / "tests" / "integration"), on_update=watch)
print(json.dumps({"exit_code": final.exit_code, "reason": final.reason, "seen": seen,
                  "events": [[e.kind, e.message] for e in final.events]}))
ray.shutdown()
cluster.shutdown()
"""


def test_a_backlog_role_grows_to_its_backlog_with_its_statistics_in_status(tmp_path: Path) -> None:
    env = {**os.environ, "RAY_TMPDIR": short_tmp_dir("dlu-asc-")}
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(ROOT)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=380,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    result = json.loads([line for line in done.stdout.splitlines() if line.startswith("{")][-1])
    assert result["exit_code"] == 0, result["reason"]
    decisions = [m for k, m in result["events"] if k == "autoscale_decision"]
    assert decisions, result["events"]
    assert (
        decisions[0].startswith("prep 1 -> ") and "per actor" in decisions[0] and "arriving" in decisions[0]
    )
    kinds = [k for k, _ in result["events"]]
    assert "resize_done" in kinds[kinds.index("autoscale_decision") :]
    seen = result["seen"]
    assert seen["throughput"].get("prep"), seen
    assert any(speed and speed > 0 for _, speed in seen["throughput"]["prep"])
    assert any(memory > 0 for _, memory in seen["usage"].values()), seen["usage"]
    assert max(seen["backlogs"].get("samples", [0])) > 0
