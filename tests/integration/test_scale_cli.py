"""`dlu scale` from another process on a local job that a `dlu run` owns: the request reaches the
job through its owner, `dlu status` shows the new size, refusals exit 2 naming the fix."""

from __future__ import annotations

import json
import subprocess
import threading
from pathlib import Path

import pytest
import yaml
from cli_runs import Box, wait_until

pytestmark = [pytest.mark.ray, pytest.mark.timeout(240)]


def sizes(box: Box, name: str) -> dict[str, int]:
    shown = box.dlu("status", name, "--json")
    if shown.returncode != 0:
        return {}
    roles = json.loads(shown.stdout)["roles"]
    return {r["name"]: r["size"] for r in roles if all(a["stage"] == "RUNNING" for a in r["actors"])}


def test_dlu_scale_of_a_local_job_run_by_another_process(box: Box, tmp_path: Path) -> None:
    name = "scale-cli"
    worker = {"entrypoint": "workloads:forever", "resources": {"cpu": 0.05}}
    spec = tmp_path / "job.yaml"
    spec.write_text(
        yaml.safe_dump(
            {
                "name": name,
                "device_type": "CPU",
                "device_per_node": 0,
                "health": {"monitor_interval_s": 0.2},
                "roles": [
                    {"name": "trainer", **worker},
                    {"name": "workers", "total": 2, "is_driver": False, "max_total": 4, **worker},
                ],
            }
        )
    )
    owner = box.start(spec)
    wait_until(lambda: sizes(box, name).get("workers") == 2, "2 workers running", owner)

    grown = box.dlu("scale", name, "workers", "3")
    assert grown.returncode == 0, grown.stdout + grown.stderr
    assert "workers: resize 2 -> 3 (dlu scale) done" in grown.stdout
    wait_until(lambda: sizes(box, name).get("workers") == 3, "3 workers running", owner)
    assert "workers (simple): size 3, 3 RUNNING, 1 resize(s)" in box.dlu("status", name).stdout

    too_big = box.dlu("scale", name, "workers", "5")
    assert too_big.returncode == 2 and "above its max_total=4" in too_big.stderr + too_big.stdout
    unknown = box.dlu("scale", name, "nope", "2")
    assert unknown.returncode == 2 and "no role 'nope'" in unknown.stderr + unknown.stdout
    assert sizes(box, name).get("workers") == 3

    assert box.dlu("stop", name).returncode == 0
    wait_until(lambda: box.stage(name) == "STOPPED", "STOPPED", None)


def test_status_shows_a_resize_while_it_runs(box: Box, tmp_path: Path) -> None:
    """Issue 27 defect 6: `dlu status` of a local job omitted `resize_started` until the resize
    ended (its `dlu run` answered the `dlu scale` on the loop that writes the job's status)."""
    name = "scale-slow"
    spec = tmp_path / "job.yaml"
    spec.write_text(
        yaml.safe_dump(
            {
                "name": name,
                "device_type": "CPU",
                "device_per_node": 0,
                "health": {"monitor_interval_s": 0.2},
                "roles": [
                    {
                        "name": "workers",
                        "entrypoint": "scale_workloads:forever",
                        "total": 1,
                        "max_total": 2,
                        "resources": {"cpu": 0.05},
                        "env": {"SCALE_SLOW_FROM": "1", "SCALE_SLOW_S": "8"},
                    }
                ],
            }
        )
    )
    owner = box.start(spec)
    wait_until(lambda: sizes(box, name).get("workers") == 1, "1 worker running", owner)
    scaled: dict[str, subprocess.CompletedProcess[str]] = {}
    scaler = threading.Thread(target=lambda: scaled.update(done=box.dlu("scale", name, "workers", "2")))
    scaler.start()
    wait_until(lambda: "resize_started" in kinds(box, name) or not scaler.is_alive(), "the resize", owner)
    assert scaler.is_alive(), "the resize_started event showed only once the resize had ended"
    assert "resize_done" not in kinds(box, name)
    scaler.join(120)
    assert scaled["done"].returncode == 0, scaled["done"].stdout + scaled["done"].stderr
    wait_until(lambda: "resize_done" in kinds(box, name), "resize_done", owner)
    assert box.dlu("stop", name).returncode == 0
    wait_until(lambda: box.stage(name) == "STOPPED", "STOPPED", None)


def kinds(box: Box, name: str) -> list[str]:
    record = box.record(name)
    return [e["kind"] for e in record["status"]["events"]] if record else []
