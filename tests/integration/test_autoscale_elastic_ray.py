"""Single-job auto-scaling of an elastic role on a real local Ray: its ranks' steps reach the
PrimeMaster relayed by their agents (their status says steps_reported False); the role is
measured near its real speed and shrunk from MAX to the faster size. The simulator's ranks report
their own steps, which hid that a relayed step was never measured: no decision was ever made on
Ray. (The polls between bursts of relayed steps are a unit test's, tests/unit/brain/
test_runtime_stats.py: at this step time the bursts did not move the figure.)"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from short_tmp import short_tmp_dir

pytestmark = [pytest.mark.ray, pytest.mark.slow, pytest.mark.timeout(300)]

ROOT = Path(__file__).resolve().parents[2]
COMPUTE_S, COMM_S = 0.4, 0.3  # 1 node: 2.5 steps/s; 2 nodes: 1 / (0.2 + 0.3) = 2.0 steps/s

SCRIPT = r"""
import json, sys, time
from pathlib import Path
import ray
from dlu_api.spec import spec_from_dict
from dlu_prime import launcher
from dlu_prime.naming import NAMESPACE

root, compute, comm = Path(sys.argv[1]), sys.argv[2], sys.argv[3]
ray.init(num_cpus=2, include_dashboard=False, namespace=NAMESPACE)
spec = spec_from_dict({
    "name": "autoscale-elastic-it", "device_type": "CPU", "device_per_node": 0,
    "master": {"cpu": 0.1}, "health": {"monitor_interval_s": 0.5, "stall_timeout_s": None},
    "env": {"CURVE_COMPUTE_S": compute, "CURVE_COMM_S": comm, "CURVE_END": str(time.time() + 45)},
    "roles": [{"name": "train", "kind": "elastic", "entrypoint": "autoscale_workloads:curve",
               "resources": {"cpu": 0.25}, "resizable": True,
               "elastic": {"nnodes": "1:2", "nproc_per_node": 1, "start_timeout_s": 20,
                           "node_check": {"enabled": False}}}],
    "autoscale": {"mode": "single-job", "settle_s": 2, "measure_s": 6},
})
final = launcher.run_job(spec, str(root / "tests" / "integration"))
print(json.dumps({"exit_code": final.exit_code, "reason": final.reason,
                  "events": [[e.kind, e.message] for e in final.events]}))
ray.shutdown()
"""


def test_an_elastic_role_is_measured_at_its_real_speed_and_shrunk_to_the_faster_size() -> None:
    env = {**os.environ, "RAY_TMPDIR": short_tmp_dir("dlu-ase-")}
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(ROOT), str(COMPUTE_S), str(COMM_S)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=280,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    result = json.loads([line for line in done.stdout.splitlines() if line.startswith("{")][-1])
    events = result["events"]
    assert result["exit_code"] == 0, (result["reason"], events)
    decisions = [m for k, m in events if k == "autoscale_decision"]
    print("\n".join(f"{k}: {m}" for k, m in events if k.startswith(("autoscale", "resize_done"))))
    assert decisions, events  # measured at all: a relayed step counts
    found = re.fullmatch(
        r"train 2 -> 1: 2 nodes ([\d.]+) steps/s, at its max 2; measuring 1 nodes", decisions[0]
    )
    assert found is not None, decisions
    expected = 1 / (COMPUTE_S / 2 + COMM_S)
    assert abs(float(found.group(1)) - expected) <= 0.2 * expected, (found.group(1), expected)
    assert any(k == "resize_done" and "world 2 -> 1" in m for k, m in events), events
    assert not [m for m in decisions[1:] if "1 -> 2" in m], decisions  # 2 nodes did not pay
