"""The campaign's cluster faults, in the default run: a Ray node of a `ray.cluster_utils.Cluster`
removed (and replaced) twice while the reference job trains, and the ElasticMaster killed
during the node check. Each must be one recovery naming the node's actors (or the
ElasticMaster), with the fault-free loss at the end and nothing left (benchmarks/chaos.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from chaos_jobs import HERE
from short_tmp import short_tmp_dir

pytestmark = [pytest.mark.ray, pytest.mark.slow, pytest.mark.timeout(1200)]


def test_node_removal_and_node_check_kill_each_one_recovery(tmp_path: Path) -> None:
    env = {**os.environ, "RAY_TMPDIR": short_tmp_dir("dlu-cc-")}
    args = [
        *("--minutes", "1", "--faults", "3", "--seed", "5", "--no-limit-case"),
        *("--kinds", "node_removal,elastic_master_node_check", "--out", str(tmp_path)),
    ]
    done = subprocess.run(
        [sys.executable, str(HERE / "chaos.py"), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=1100,
        check=False,
    )
    report = done.stdout[done.stdout.find("chaos campaign") :]
    assert done.returncode == 0, report or done.stdout[-3000:] + done.stderr[-3000:]
    assert "PASS" in report.splitlines()
    assert "3 faults injected of 3 planned" in report, report
