"""A rank that finished takes part in the in-place restart a peer's failure opens (torchrun's
semantics: the whole worker group restarts, workers that exited 0 included), in both orders:
the rank finishes before its peer fails, or while the peer's restart is under way. Before the
fix the new round waited for the finished rank for ever ("1 FINISH, 2 RUNNING")."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from lm_jobs import status_of, wait_until
from test_elastic import elastic_job

pytestmark = [pytest.mark.ray, pytest.mark.slow, pytest.mark.timeout(120)]

HERE = Path(__file__).parent
ENTRY = "elastic_workloads:finish_or_fail_on_first_attempt"


def _stopped(job: str) -> bool:
    status = status_of(job)
    return status is not None and status.stage.value == "STOPPED"


def _run_to_the_end(spec: Any) -> Any:
    """Submit, wait (bounded: a hang fails the test with the status it hung in), collect."""
    from dlu_prime import launcher

    launcher.submit_job(spec, str(HERE))
    try:
        wait_until(f"job {spec.name} to stop", lambda: _stopped(spec.name), timeout_s=60)
    except AssertionError:
        status = status_of(spec.name)
        launcher.stop_job(spec.name, "test timed out")
        launcher.wait_job(spec)
        raise AssertionError(f"job {spec.name} did not end: {status}") from None
    return launcher.wait_job(spec)


@pytest.mark.parametrize(
    ("nnodes", "nproc", "fail_first"),
    [(1, 2, False), (2, 1, False), (1, 2, True)],
    ids=["finished-then-peer-fails-1x2", "finished-then-peer-fails-2x1", "peer-fails-then-finished-1x2"],
)
def test_finished_rank_runs_again_in_the_restart_its_peer_caused(
    ray_session: Any, tmp_path: Path, nnodes: int, nproc: int, fail_first: bool
) -> None:
    name = f"el-fin-{nnodes}x{nproc}{'-ff' if fail_first else ''}"
    env = {"OUT_DIR": str(tmp_path), "FAIL_FIRST": "1" if fail_first else "0", "FAIL_DELAY_S": "1.0"}
    status = _run_to_the_end(elastic_job(name, ENTRY, nnodes, nproc, env=env))

    assert status.stage.value == "STOPPED"
    assert status.exit_code == 0, status.reason
    restarts = [e for e in status.events if e.kind == "inplace_restart"]
    assert len(restarts) == 1, restarts
    assert restarts[0].actor == f"{name}.trainer.1" and "exited 3" in restarts[0].message, restarts[0]
    (role,) = status.roles
    assert role.inplace_restart_count == 1 and role.restart_count == 0
    workers = [a for a in role.actors if a.rank >= 0]
    assert sorted(a.rank for a in workers) == [0, 1]
    assert all(a.stage == "FINISH" and a.restart_count == 0 for a in workers), workers
    # Both ranks ran twice: rank 0 ran again although its first run had exited 0.
    ran = sorted(p.name for p in tmp_path.glob("ran-*.json"))
    assert ran == ["ran-0-0.json", "ran-0-1.json", "ran-1-0.json", "ran-1-1.json"], ran
    second = [json.loads((tmp_path / f"ran-{r}-1.json").read_text()) for r in (0, 1)]
    assert all(s["world_size"] == "2" for s in second)


def test_peer_failure_at_the_restart_limit_ends_the_job_naming_it(ray_session: Any, tmp_path: Path) -> None:
    """max_restart=0: the peer's failure may not restart the group, so the job stops (exit 1,
    the limit and the failed rank in the reason) instead of waiting; the finished rank stays FINISH."""
    name = "el-fin-limit"
    env = {"OUT_DIR": str(tmp_path), "FAIL_DELAY_S": "1.0"}
    status = _run_to_the_end(elastic_job(name, ENTRY, 1, 2, env=env, max_restart=0))

    assert status.stage.value == "STOPPED"
    assert status.exit_code == 1
    assert "max_restart=0" in status.reason and f"{name}.trainer.1" in status.reason, status.reason
    stages = {a.rank: a.stage for a in status.roles[0].actors if a.rank >= 0}
    assert stages[0] == "FINISH" and stages[1] != "RUNNING", stages
    assert sorted(p.name for p in tmp_path.glob("ran-*.json")) == ["ran-0-0.json", "ran-1-0.json"]
