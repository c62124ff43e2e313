"""A rank that finished takes part in the in-place restart a peer's failure opens (torchrun's
semantics: the whole worker group restarts, workers that exited 0 included), in both orders:
the rank finishes before its peer fails, or while the peer's restart is under way; and when the
ElasticMaster is replaced (tier 5) after a rank finished. Before, the new round waited for the
finished rank for ever ("1 FINISH, 2 RUNNING"). At the restart limit the job ends, naming it."""

from __future__ import annotations

import json
from collections.abc import Callable
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


def _run_to_the_end(spec: Any, while_running: Callable[[], None] = lambda: None) -> Any:
    """Submit, call `while_running`, wait (bounded: a hang fails the test with the status it
    hung in, and the job is stopped), collect."""
    from dlu_prime import launcher

    launcher.submit_job(spec, str(HERE))
    try:
        while_running()
        wait_until(f"job {spec.name} to stop", lambda: _stopped(spec.name), timeout_s=60)
    except Exception as exc:
        status = status_of(spec.name)
        launcher.stop_job(spec.name, "test timed out")
        launcher.wait_job(spec)
        raise AssertionError(f"job {spec.name} did not end ({exc}): {status}") from exc
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


def test_finished_rank_follows_a_replaced_elastic_master(ray_session: Any, tmp_path: Path) -> None:
    """The ElasticMaster dies while rank 0 has finished and rank 1 trains: its replacement's
    rendezvous expects both ranks, so rank 0 joins it and runs again, as rank 1 does (tier 5)."""
    name = "el-fin-moved"
    spec = elastic_job(
        name,
        "elastic_workloads:finish_while_peer_trains_on_first_attempt",
        1,
        2,
        env={"OUT_DIR": str(tmp_path)},
    )
    sub = f"{name}.trainer.submaster"

    def kill_the_elastic_master() -> None:
        wait_until("rank 0 finished", lambda: _stage_of(f"{name}.trainer.0") == "FINISH", timeout_s=60)
        wait_until("rank 1 training", lambda: (tmp_path / "ran-1-0.json").exists(), timeout_s=30)
        _kill(int(_actor_status(sub)["pid"]))

    status = _run_to_the_end(spec, kill_the_elastic_master)

    assert status.exit_code == 0, status.reason
    kinds = [(e.kind, e.actor) for e in status.events if e.kind in ("failover_started", "inplace_restart")]
    assert kinds == [("failover_started", sub)], kinds
    ran = sorted(p.name for p in tmp_path.glob("ran-*.json"))
    assert ran == ["ran-0-0.json", "ran-0-1.json", "ran-1-0.json", "ran-1-1.json"], ran
    assert all(a.stage == "FINISH" for a in status.roles[0].actors if a.rank >= 0)


def test_a_finished_non_driver_role_stays_finished_when_its_elastic_master_is_replaced(
    ray_session: Any, tmp_path: Path
) -> None:
    """Every rank of a non-driver elastic role finished while the driver role goes on; then its
    ElasticMaster dies. The replacement must not rerun the finished ranks (before, their agents
    followed it into a new round and trained again): one SubMaster failover, each rank ran once."""
    from dlu_api.spec import spec_from_dict

    name = "el-fin-role"
    go = tmp_path / "go"
    spec = spec_from_dict(
        {
            "name": name,
            "device_type": "CPU",
            "device_per_node": 0,
            "health": {"monitor_interval_s": 0.2},
            "config": {"go": str(go)},
            "roles": [
                {"name": "driver", "entrypoint": "workloads:wait_for_go", "resources": {"cpu": 0.1}},
                {
                    "name": "trainer",
                    "kind": "elastic",
                    "entrypoint": "elastic_workloads:record_run",
                    "is_driver": False,
                    "resources": {"cpu": 0.25},
                    "env": {"OUT_DIR": str(tmp_path)},
                    "elastic": {"nnodes": 1, "nproc_per_node": 2, "node_check": {"enabled": False}},
                },
            ],
        }
    )
    sub = f"{name}.trainer.submaster"

    def kill_the_elastic_master_of_the_finished_role() -> None:
        for rank in (0, 1):
            wait_until(
                f"rank {rank} finished", lambda r=rank: _stage_of(f"{name}.trainer.{r}") == "FINISH", 60
            )
        _kill(int(_actor_status(sub)["pid"]))
        wait_until("the ElasticMaster replaced", lambda: _sub_master_failover_done(name), timeout_s=60)
        # Each rank's agent follows the new master, which tells it training is over (before the
        # fix, they joined its round and ran again, and were never told).
        wait_until(
            "both ranks told training is over (or one ran again)",
            lambda: _ran_again(tmp_path) or all(_training_ended(f"{name}.trainer.{r}") for r in (0, 1)),
            timeout_s=30,
        )
        go.write_text("")

    status = _run_to_the_end(spec, kill_the_elastic_master_of_the_finished_role)

    assert status.exit_code == 0, status.reason
    runs = {r: (tmp_path / f"runs-{r}.txt").read_text().split() for r in (0, 1)}
    assert all(len(pids) == 1 for pids in runs.values()), f"a finished rank ran again: {runs}"
    started = [e.actor for e in status.events if e.kind == "failover_started"]
    assert started == [sub], started
    assert not [e for e in status.events if e.kind == "inplace_restart"]
    trainer = next(r for r in status.roles if r.name == "trainer")
    assert all(a.stage == "FINISH" for a in trainer.actors if a.rank >= 0), trainer.actors


def _ran_again(out: Path) -> bool:
    return any(len(p.read_text().split()) > 1 for p in out.glob("runs-*.txt"))


def _training_ended(actor: str) -> bool:
    return _actor_status(actor).get("training_ended") is True


def _sub_master_failover_done(job: str) -> bool:
    status = status_of(job)
    return status is not None and any(
        e.kind == "failover_done" and e.tier == "sub_master" for e in status.events
    )


def _actor_status(actor: str) -> dict[str, Any]:
    import ray

    from dlu_prime.naming import NAMESPACE

    return dict(ray.get(ray.get_actor(actor, namespace=NAMESPACE).status.remote(), timeout=30))


def _stage_of(actor: str) -> str | None:
    try:
        return str(_actor_status(actor)["stage"])
    except Exception:
        return None


def _kill(pid: int) -> None:
    import os
    import signal

    os.kill(pid, signal.SIGKILL)
