"""The example jobs (one per driving pattern) run end to end on a real local Ray."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from short_tmp import short_tmp_dir

from dlu_api.spec import load_spec

pytestmark = [pytest.mark.ray, pytest.mark.timeout(180)]

ROOT = Path(__file__).resolve().parents[2]


def run_example(path: str, log_dir: Path | None = None) -> Any:
    from dlu_prime import launcher
    from dlu_prime.scheduler.cleanup import job_actor_names, job_placement_groups

    spec = load_spec(ROOT / path)
    if log_dir is not None:
        spec = spec.model_copy(update={"logs": spec.logs.model_copy(update={"dir": str(log_dir)})})
    status = launcher.run_job(spec, str(ROOT))
    assert status.exit_code == 0, status.reason
    assert job_actor_names(spec.name) == [] and job_placement_groups(spec.name) == []
    return status


def printed(log_dir: Path, status: Any, role: str = "trainer") -> list[str]:
    """What rank 0 of `role` printed (its rank file; the example tees it to `dlu run`)."""
    lines = (log_dir / status.name / status.run_id / role / "rank0.out").read_text().splitlines()
    return [line for line in lines if not line.startswith("==== dlu: ")]  # the start marker


def test_worker_self_loop_pipeline_moves_every_record(ray_session: Any, tmp_path: Path) -> None:
    status = run_example("examples/pipeline/job.yaml", tmp_path)
    created = sorted(e.message for e in status.events if e.kind == "channel_created")
    assert created == ["channel 'batches' created", "channel 'raw' created", "channel 'tokens' created"]
    assert all(a.stage == "FINISH" for r in status.roles for a in r.actors)
    lines = printed(tmp_path, status)
    assert lines[0] == "trainer: batch 1, 8/64 records"  # progress, batch by batch
    assert "trainer: batch 8, 64/64 records" in lines
    assert lines[-1].startswith("trainer: 8 batches, 64 records, final loss ")  # the result


def test_trainer_driven_rl_calls_roles_over_rpc(ray_session: Any, tmp_path: Path) -> None:
    status = run_example("examples/rl/job.yaml", tmp_path)
    assert "trainer" in status.reason
    assert [a.stage for a in status.roles[0].actors] == ["FINISH"]
    lines = printed(tmp_path, status)
    assert [line.split(":")[0] for line in lines[:-1]] == [f"iteration {i}" for i in range(8)]
    assert lines[-1].startswith("trainer: policy improved, p_good "), lines[-1]


@pytest.mark.timeout(300)
def test_pipeline_run_prints_progress_and_result(tmp_path: Path) -> None:
    """`dlu run examples/pipeline/job.yaml` shows the trainer's progress and result lines."""
    done = _dlu(["run", "examples/pipeline/job.yaml"], tmp_path, timeout=280)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "[trainer/rank0] trainer: batch 1, 8/64 records" in done.stdout
    assert "[trainer/rank0] trainer: 8 batches, 64 records, final loss " in done.stdout


def test_hello(ray_session: Any) -> None:
    run_example("examples/hello/job.yaml")


@pytest.mark.timeout(400)
def test_readme_run_command(tmp_path: Path) -> None:
    """`dlu run examples/elastic/job.yaml`, as the README says, in its own process and Ray."""
    env = {
        **os.environ,
        "RAY_TMPDIR": short_tmp_dir("dlu-readme-"),
        "DLU_HOME": str(tmp_path),
        "LM_CHECKPOINT_DIR": str(tmp_path / "ckpt"),
    }
    dlu = Path(sys.executable).parent / "dlu"
    done = subprocess.run(
        [str(dlu), "run", "examples/elastic/job.yaml"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=380,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "job lm: STOPPED (exit code 0)" in done.stdout
    assert "[lm] stage RUNNING" in done.stdout
    assert "node_check" in done.stdout
    assert "trainer (elastic): nodes 2 (min 2, max 2), 4 FINISH, step 30" in done.stdout  # the final step
    # Quiet by default: none of Ray's own warnings; what the ranks print goes to their rank
    # files, and the example tees rank 0's stdout with its rank's prefix.
    assert "[trainer/rank0] final loss" in done.stdout
    for step in (5, 30):  # progress every 5 steps, not only the final loss
        assert f"[trainer/rank0] step {step}/30 loss " in done.stdout
    assert "[trainer/rank1]" not in done.stdout
    assert "Scheduling a restartable detached actor" not in done.stdout + done.stderr
    assert (tmp_path / "ckpt" / "final_loss.txt").is_file()
    assert (tmp_path / "jobs" / "lm.json").is_file()  # `dlu status lm` reads it


def _dlu(args: list[str], home: Path, timeout: float = 380) -> subprocess.CompletedProcess[str]:
    """`dlu ARGS` from the repository root, in its own process, embedded Ray and DLU_HOME."""
    env = {
        **os.environ,
        "RAY_TMPDIR": short_tmp_dir("dlu-readme-"),
        "DLU_HOME": str(home),
    }
    env.pop("LM_CHECKPOINT_DIR", None)
    dlu = Path(sys.executable).parent / "dlu"
    return subprocess.run(
        [str(dlu), *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout, check=False
    )


@pytest.mark.timeout(400)
def test_readme_torchrun_example_runs_on_this_machine(tmp_path: Path) -> None:
    """2 nodes x 2 processes want more logical CPUs than a 2-core laptop has: a local run
    oversubscribes them (as torchrun does) instead of refusing the job."""
    command = ["torchrun", "--nnodes=2", "--nproc-per-node=2", "examples/elastic/allreduce.py"]
    done = _dlu(["run", "--device-type", "cpu", "--", *command], tmp_path)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "STOPPED (exit code 0)" in done.stdout


@pytest.mark.timeout(800)
def test_readme_job_trains_again_on_a_second_run(tmp_path: Path) -> None:
    """Each run checkpoints in a folder of its own (DLU_RUN_ID): a second run trains afresh."""
    for _ in range(2):
        done = _dlu(["run", "--verbose", "examples/elastic/job.yaml"], tmp_path)  # the script's output
        output = done.stdout + done.stderr
        assert done.returncode == 0, output[-3000:]
        assert "already trained" not in output
        assert "final loss" in output
        assert "trainer (elastic): 4 FINISH, 1 RUNNING" not in output
