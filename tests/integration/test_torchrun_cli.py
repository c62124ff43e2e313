"""`dlu run -- torchrun ...` as a torchrun user types it: a MIN:MAX range runs on every node this
machine fits, two torchrun jobs get names of their own, and DLU's differences are printed."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from cli_runs import DLU, HERE, Box

pytestmark = [pytest.mark.ray, pytest.mark.slow, pytest.mark.timeout(240)]


def dlu_run(box: Box, out: Path, *torchrun: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [DLU, "run", "--device-type", "CPU", "--", "torchrun", *torchrun, "torchrun_env_script.py"],
        cwd=HERE,
        env=box.env(box.new_dir("dlu-cli-"), OUT_DIR=str(out)),
        capture_output=True,
        text=True,
        timeout=200,
    )


def test_min_max_nodes_run_on_every_node_that_fits_and_names_differ(box: Box, tmp_path: Path) -> None:
    first, second = tmp_path / "first", tmp_path / "second"
    first.mkdir()
    second.mkdir()
    done = dlu_run(box, first, "--nnodes=1:2", "--nproc-per-node=1")
    assert done.returncode == 0, done.stdout + done.stderr
    text = done.stdout + done.stderr
    # the embedded Ray is sized for MAX: both nodes train, in one world
    worlds = {json.loads(p.read_text())["env"]["GROUP_WORLD_SIZE"] for p in first.glob("env-r*-a0.json")}
    assert worlds == {"2"}, text
    assert "waiting_for_nodes" not in text  # both fit at once: nothing waited for
    assert sorted(p.name for p in first.glob("env-r*-a0.json")) == ["env-r0-a0.json", "env-r1-a0.json"]
    # DLU's differences from torchrun, said at start
    assert "DLU restarts failed ranks up to 10 times (torchrun's default is 0)" in text
    assert "job name: torchrun-env-script-" in text
    again = dlu_run(box, second, "--nproc-per-node=1", "--max-restarts=0")
    assert again.returncode == 0, again.stdout + again.stderr
    jobs = sorted(p.stem for p in (box.home / "jobs").glob("*.json"))
    assert len(jobs) == 2 and all(j.startswith("torchrun-env-script-") for j in jobs), jobs
    assert "up to 10 times" not in again.stdout + again.stderr
