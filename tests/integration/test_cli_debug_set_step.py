"""`dlu debug JOB set-step ROLE --step N` on a running local job whose workers beat on their
own: the step set stays (the next heartbeat does not undo it) and goes on from N."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from cli_runs import Box, wait_until

pytestmark = [pytest.mark.ray, pytest.mark.timeout(240)]

SPEC = """
name: set-step
device_type: CPU
device_per_node: 0
roles:
  - name: worker
    entrypoint: workloads:forever
    total: 1
    resources: {cpu: 0.1}
"""
TARGET = 100_000


def _step(box: Box) -> int:
    done = box.dlu("debug", "set-step", "get-step", "worker")
    assert done.returncode == 0, done.stdout + done.stderr
    return int(done.stdout.split()[-1])


def test_set_step_sticks_and_goes_on_from_there(box: Box, tmp_path: Path) -> None:
    spec = tmp_path / "job.yaml"
    spec.write_text(SPEC)
    run = box.start(spec)
    wait_until(lambda: box.stage("set-step") == "RUNNING", "RUNNING", run)
    wait_until(lambda: _step(box) > 0, "a first step", run)
    done = box.dlu("debug", "set-step", "set-step", "worker", "--step", str(TARGET))
    assert done.returncode == 0, done.stdout + done.stderr
    wait_until(lambda: _step(box) >= TARGET, f"step {TARGET} in the status", run)
    first = _step(box)
    time.sleep(1.0)  # 20 beats of the workload's own loop
    later = _step(box)
    assert TARGET <= first < later, (first, later)
