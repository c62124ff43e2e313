"""What `dlu run` prints of a failing torchrun job (into a pipe): the failing rank's traceback
once (from its tee'd stderr; event lines, the reason and the root cause quote its first line),
and one start-marker line per rank although each rank's stdout and stderr files both begin
with one."""

from __future__ import annotations

import subprocess

import pytest
from cli_runs import DLU, HERE, Box

pytestmark = [pytest.mark.ray, pytest.mark.timeout(240)]


def test_a_failing_rank_shows_its_traceback_once_and_one_start_line_per_rank(box: Box) -> None:
    env = box.env(box.new_dir("dlu-cli-"))
    env.pop("DLU_VERBOSE", None)
    run = subprocess.run(
        [
            DLU,
            "run",
            "--device-type",
            "cpu",
            "--name",
            "fails",
            "--",
            "torchrun",
            "--nnodes=1",
            "--nproc-per-node=2",
            "--max-restarts=0",
            "failing_script.py",
        ],
        cwd=HERE,
        env=env,
        capture_output=True,
        text=True,
        timeout=200,
    )
    out = run.stdout + run.stderr
    assert run.returncode == 1, out[-4000:]
    assert out.count("Traceback (most recent call last)") == 1, out
    assert out.count("RuntimeError: boom from failing_script") >= 2, out  # the traceback, and the reason
    assert "[trainer/rank1:err] RuntimeError: boom from failing_script" in out, out
    for rank in (0, 1):
        markers = [line for line in out.splitlines() if f"==== dlu: trainer/rank{rank} started" in line]
        assert len(markers) == 1, out
    status = subprocess.run([DLU, "status", "fails"], env=env, capture_output=True, text=True, timeout=60)
    assert status.stdout.count("Traceback (most recent call last)") == 1, status.stdout
