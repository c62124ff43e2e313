"""On a two-node `ray.cluster_utils.Cluster` (all on loopback): the reference job (char-level
LM, 2 nodes x 2 processes, node check on) across both Ray nodes; a node made slow reported a
straggler; a node failing the check reported faulty, its actor restarted, and training run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from short_tmp import short_tmp_dir

pytestmark = [pytest.mark.ray, pytest.mark.slow, pytest.mark.timeout(700)]

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = r"""
import json, sys
from pathlib import Path
from dlu_prime.ray_env import pin_loopback
import ray
from ray.cluster_utils import Cluster
from dlu_api.spec import load_spec, spec_from_dict
from dlu_prime import launcher
from dlu_prime.naming import NAMESPACE

root, out = Path(sys.argv[1]), Path(sys.argv[2])
with pin_loopback():  # every node and this driver stay on 127.0.0.1
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 2, "include_dashboard": False,
                      "node_ip_address": "127.0.0.1"})
    cluster.add_node(num_cpus=2, node_ip_address="127.0.0.1")
    ray.init(address=cluster.address, namespace=NAMESPACE)
data = load_spec(root / "examples/elastic/job.yaml").model_dump(mode="json")
data["name"] = "lm-cluster"
data["placement_strategy"] = "STRICT_SPREAD"   # one node's ranks per Ray node
data["master"] = {"cpu": 0.1}
data["roles"][0]["entrypoint"] = f"examples/elastic/train_lm.py --steps 12 --checkpoint-dir {out}"
spec = spec_from_dict(data)
final = launcher.run_job(spec, str(root))
results = {"reference": {"exit_code": final.exit_code, "reason": final.reason,
                         "nodes": sorted({a.node_id for a in final.roles[0].actors if a.rank >= 0}),
                         "events": [e.kind for e in final.events],
                         "loss": (out / "final_loss.txt").read_text() if (out / "final_loss.txt").exists() else None}}

def check_job(name, env):
    job = spec_from_dict({
        "name": name, "device_type": "CPU", "device_per_node": 0, "node_num": 2,
        "placement_strategy": "STRICT_SPREAD", "master": {"cpu": 0.1},
        "health": {"monitor_interval_s": 0.2},
        "roles": [{"name": "trainer", "kind": "elastic", "entrypoint": "elastic_workloads:allreduce_only",
                   "resources": {"cpu": 0.25}, "env": env,
                   "elastic": {"nnodes": 2, "nproc_per_node": 1,
                               "node_check": {"matmul_size": 64, "allreduce_mb": 0.5, "timeout_s": 30,
                                              "straggler_ratio": 1.5}}}],
    })
    status = launcher.run_job(job, str(root / "tests" / "integration"))
    return {"exit_code": status.exit_code, "reason": status.reason,
            "events": [[e.kind, e.message] for e in status.events],
            "restarts": {a.name: a.restart_count for a in status.roles[0].actors if a.rank >= 0}}

results["slow"] = check_job("cl-slow", {"DLU_NODE_CHECK_FAULT_NODE": "node-1", "DLU_NODE_CHECK_DELAY_S": "1.5"})
results["faulty"] = check_job("cl-faulty", {"DLU_NODE_CHECK_FAULT_NODE": "node-1", "DLU_NODE_CHECK_FAIL": "1",
                                            "DLU_NODE_CHECK_FAULT_COUNTER": str(out / "faults"),
                                            "DLU_NODE_CHECK_FAULT_TIMES": "2"})
print(json.dumps(results))
ray.shutdown()
cluster.shutdown()
"""


def test_reference_job_straggler_and_faulty_node_across_two_ray_nodes(tmp_path: Path) -> None:
    env = {**os.environ, "RAY_TMPDIR": short_tmp_dir("dlu-elc-")}
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(ROOT), str(tmp_path)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=680,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    results = json.loads([line for line in done.stdout.splitlines() if line.startswith("{")][-1])
    reference = results["reference"]
    assert reference["exit_code"] == 0, reference["reason"]
    assert len(reference["nodes"]) == 2  # ranks really ran on both Ray nodes
    assert "node_check" in reference["events"]
    assert reference["loss"] is not None

    slow = results["slow"]
    assert slow["exit_code"] == 0, slow["reason"]
    assert any(kind == "straggler" and "node-1" in message for kind, message in slow["events"])

    faulty = results["faulty"]
    assert faulty["exit_code"] == 0, faulty["reason"]
    assert any(kind == "faulty_node" and "node-1" in message for kind, message in faulty["events"])
    assert faulty["restarts"] == {"cl-faulty.trainer.0": 0, "cl-faulty.trainer.1": 1}
