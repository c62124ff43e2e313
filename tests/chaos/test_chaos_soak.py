"""The long chaos pieces (`pytest -m soak`): a few minutes of benchmarks/chaos.py on a multi-node
`ray.cluster_utils.Cluster` with the fault kinds the short test leaves out (a Ray node removed
and replaced, the ElasticMaster killed during the node check, the PrimeMaster killed twice in a
row and during a failover, pipeline producers and consumers killed with every record counted,
a role run into max_restart); and the fault-free loss the campaign compares with, computed in
one process, against a fault-free run of the job itself."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from chaos_jobs import HERE, Training
from chaos_reference import reference_loss
from chaos_run import run_limit_case, run_reference
from short_tmp import short_tmp_dir

pytestmark = [pytest.mark.ray, pytest.mark.slow, pytest.mark.soak]

KINDS = (
    "node_removal,elastic_master_node_check,prime_master_twice,prime_master_in_failover,"
    "proc_hang,worker_kill,producer_kill,consumer_kill"
)


@pytest.mark.timeout(2400)
def test_chaos_benchmark_on_a_cluster_passes(tmp_path: Path) -> None:
    env = {**os.environ, "RAY_TMPDIR": short_tmp_dir("dlu-cs-")}
    args = ["--minutes", "2", "--faults", "10", "--seed", "3", "--kinds", KINDS, "--out", str(tmp_path)]
    done = subprocess.run(
        [sys.executable, str(HERE / "chaos.py"), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=2300,
        check=False,
    )
    report = done.stdout[done.stdout.find("chaos campaign") :]
    assert done.returncode == 0, report or done.stdout[-3000:] + done.stderr[-3000:]
    assert "PASS" in report.splitlines()
    assert "limit stop       ok" in report


@pytest.mark.timeout(600)
def test_simulated_fault_free_loss_equals_the_jobs(ray_session: Any, tmp_path: Path) -> None:
    steps = 60
    assert run_reference(Training("chaos-ref", steps, tmp_path, step_s=0.0)) == reference_loss(steps, 4)


@pytest.mark.timeout(600)
def test_role_over_max_restart_stops_naming_the_limit_and_the_killed_actor(
    ray_session: Any, tmp_path: Path
) -> None:
    training = Training("chaos-limit", 100_000, tmp_path, nnodes=2, nproc=1, max_restart=2, sidecar=False)
    limit, left = run_limit_case(training, kills=3)
    assert limit.ok, f"exit code {limit.exit_code}: {limit.reason}"
    assert left == []
