"""The reference job (char-level LM, 2 nodes x 2 processes, node check on) across two Ray
nodes of a `ray.cluster_utils.Cluster`, all on loopback."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

pytestmark = [pytest.mark.ray, pytest.mark.slow, pytest.mark.timeout(420)]

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = r"""
import json, sys
from pathlib import Path
from dlu_prime.ray_env import pin_loopback
pin_loopback()
import ray
from ray.cluster_utils import Cluster
from dlu_api.spec import load_spec, spec_from_dict
from dlu_prime import launcher
from dlu_prime.naming import NAMESPACE

root, out = Path(sys.argv[1]), Path(sys.argv[2])
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
print(json.dumps({"exit_code": final.exit_code, "reason": final.reason,
                  "nodes": sorted({a.node_id for a in final.roles[0].actors if a.rank >= 0}),
                  "events": [e.kind for e in final.events],
                  "loss": (out / "final_loss.txt").read_text() if (out / "final_loss.txt").exists() else None}))
ray.shutdown()
cluster.shutdown()
"""


def test_reference_job_across_two_ray_nodes(tmp_path: Path) -> None:
    env = {**os.environ, "RAY_TMPDIR": tempfile.mkdtemp(prefix="dlu-elc-", dir="/tmp")}
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(ROOT), str(tmp_path)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=400,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["exit_code"] == 0, result["reason"]
    assert len(result["nodes"]) == 2  # ranks really ran on both Ray nodes
    assert "node_check" in result["events"]
    assert result["loss"] is not None
