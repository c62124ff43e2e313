"""The bundle a relaunched actor leaves in a group others still use, on a real local Ray (issue
30): it stays reserved (Ray frees a group's bundles only with the whole group) and is reported
free; the rank a growth of the role adds next takes it instead of a group of its own, so Ray's
reserved memory does not grow; nothing of the job stays reserved once it ends, and no healthy
actor was restarted on the way."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from short_tmp import short_tmp_dir

pytestmark = [pytest.mark.ray, pytest.mark.slow, pytest.mark.timeout(300)]

ROOT = Path(__file__).resolve().parents[2]
LIMIT_MB = 600
HOLD_MB = 560

SCRIPT = r"""
import json, os, sys, threading, time
from pathlib import Path
import ray
from ray.util import placement_group_table
from dlu_api.spec import spec_from_dict
from dlu_prime import launcher
from dlu_prime.naming import NAMESPACE

root, limit_mb = Path(sys.argv[1]), int(sys.argv[2])
ray.init(num_cpus=2, include_dashboard=False, namespace=NAMESPACE)
spec = spec_from_dict({
    "name": "bundle-it", "device_type": "CPU", "device_per_node": 0,
    "master": {"cpu": 0.1}, "health": {"monitor_interval_s": 0.5, "stall_timeout_s": None},
    "roles": [{"name": "hog", "entrypoint": "memory_workloads:shared_hog", "total": 2,
               "resizable": True, "max_total": 3,
               "resources": {"cpu": 0.25, "memory": f"{limit_mb}MiB"}}],
    "autoscale": {"mode": "single-job", "settle_s": 2, "measure_s": 2},
})
MiB = 2**20
seen, scaled = {}, []

def reserved():
    return (ray.cluster_resources().get("memory", 0.0) - ray.available_resources().get("memory", 0.0)) / MiB

def created():
    return sorted(g["name"] for g in placement_group_table().values()
                  if (g["name"] or "").startswith("bundle-it") and g["state"] == "CREATED")

def settled(expected, deadline_s=5.0):  # Ray's count of free resources may lag a change
    deadline = time.monotonic() + deadline_s
    while abs(reserved() - expected) > 0.5 and time.monotonic() < deadline:
        time.sleep(0.2)
    return reserved()

def scale():
    scaled.append(launcher.scale_job("bundle-it", "hog", 3))

def watch(status):
    kinds = [e.kind for e in status.events]
    if status.stage.value == "RUNNING" and "memory_relaunch" not in kinds and "before" not in seen:
        seen["before"] = [reserved(), created(), list(status.free_bundles)]
    if "memory_relaunch_done" in kinds and "relaunched" not in seen:
        before = seen["before"][0]
        seen["relaunched"] = [settled(before + limit_mb * 1.5), created(), list(status.free_bundles)]
        threading.Thread(target=scale, daemon=True).start()
    if "resize_done" in kinds and "grown" not in seen:
        seen["grown"] = [settled(seen["relaunched"][0]), created(), list(status.free_bundles)]
        Path(os.environ["MEMORY_DONE"]).write_text("done")

final = launcher.run_job(spec, str(root / "tests" / "integration"), on_update=watch)
seen["ended"] = [settled(0.0, 10.0), created(), list(final.free_bundles)]
print(json.dumps({"exit_code": final.exit_code, "reason": final.reason, "seen": seen, "scaled": scaled,
                  "actors": [[a.name, a.restart_count] for r in final.roles for a in r.actors],
                  "restarts": [r.restart_count for r in final.roles],
                  "events": [[e.kind, e.message] for e in final.events]}))
ray.shutdown()
"""


def test_the_bundle_a_relaunch_left_is_reported_then_taken_by_the_next_rank_and_nothing_leaks(
    tmp_path: Path,
) -> None:
    env = {
        **os.environ,
        "RAY_TMPDIR": short_tmp_dir("dlu-bun-"),
        "MEMORY_MARKER": str(tmp_path / "incarnation"),
        "MEMORY_DONE": str(tmp_path / "done"),
        "MEMORY_HOLD_MB": str(HOLD_MB),
        "MEMORY_HOG_RANK": "1",
    }
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(ROOT), str(LIMIT_MB)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=280,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    result = json.loads([line for line in done.stdout.splitlines() if line.startswith("{")][-1])
    events, seen = result["events"], result["seen"]
    print("reserved MiB, groups, free bundles:", json.dumps(seen, indent=1))
    print("\n".join(f"{k}: {m}" for k, m in events if k.startswith(("memory_relaunch", "bundle_", "resize"))))
    assert result["exit_code"] == 0, (result["reason"], events)
    kinds = [k for k, _ in events]
    assert kinds.count("memory_relaunch") == 1, events
    assert not [k for k in kinds if k.startswith("failover") or k in ("died", "failed", "restarted")], events
    assert set(result["restarts"]) == {0} and {n for _, n in result["actors"]} == {0}
    mem = LIMIT_MB * 3 // 2 * 2**20
    before, relaunched, grown, ended = (seen[k] for k in ("before", "relaunched", "grown", "ended"))
    assert abs(before[0] - 2 * LIMIT_MB) < 0.5 and before[1] == ["bundle-it.pg.hog"] and before[2] == []
    # the relaunched rank's own group is added; its bundle in the role's group stays, reported free
    assert abs(relaunched[0] - 2 * LIMIT_MB - 1.5 * LIMIT_MB) < 0.5, seen
    assert relaunched[1] == ["bundle-it.pg.hog", f"bundle-it.pg.hog.1.mem{mem}"]
    free = f"bundle 1 of group hog free, CPU 0.25, memory {LIMIT_MB} MiB reserved unused"
    assert relaunched[2] == [free] and ["bundle_free", free] in events
    # the rank the growth adds takes that bundle: no group of its own, no more memory reserved
    assert result["scaled"] and abs(grown[0] - relaunched[0]) < 0.5, seen
    assert grown[1] == relaunched[1] and grown[2] == []
    reuse = "bundle-it.hog.2 placed in bundle 1 of group hog, left free by a relaunch: nothing more reserved"
    assert ["bundle_reused", reuse] in events
    # the job's end gives everything back
    assert abs(ended[0]) < 0.5 and ended[1] == [], seen
