"""A quiet `dlu run` does not show Ray's "(raylet) A worker died or was killed ..." message
(the job's own events report the death); `--verbose` still does."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from cli_runs import DLU, HERE, Box

pytestmark = [pytest.mark.ray, pytest.mark.timeout(300)]

SPEC = """
name: {name}
device_type: CPU
device_per_node: 0
roles:
  - name: worker
    entrypoint: workloads:die_hard
    total: 1
    max_restart: 0
    resources: {{cpu: 0.1}}
"""
RAYLET = "A worker died or was killed"


def _run(box: Box, tmp_path: Path, name: str, *options: str) -> str:
    spec = tmp_path / f"{name}.yaml"
    spec.write_text(SPEC.format(name=name))
    env = box.env(box.new_dir("dlu-cli-"))
    env.pop("DLU_VERBOSE", None)
    done = subprocess.run(
        [DLU, "run", *options, str(spec)], cwd=HERE, env=env, capture_output=True, text=True, timeout=240
    )
    out = done.stdout + done.stderr
    assert done.returncode == 1, out[-4000:]
    assert "actor process died" in out, out[-4000:]  # the death happened, and DLU reported it
    return out


def test_a_quiet_run_hides_the_raylets_worker_died_message(box: Box, tmp_path: Path) -> None:
    out = _run(box, tmp_path, "quiet-death")
    assert RAYLET not in out and "(raylet)" not in out, out[-4000:]


def test_a_verbose_run_shows_it(box: Box, tmp_path: Path) -> None:
    out = _run(box, tmp_path, "loud-death", "--verbose")
    assert RAYLET in out, out[-4000:]
