"""The failover ladder on a real local Ray, with real faults: processes killed with SIGKILL at a
chosen training step, the reference LM job checked against a fault-free run (same final loss).

Families (the failover seed's test coverage): test_failover_training (ElasticWorker actor
killed, twice in a row in one role), job-level failover of a role without a SubMaster, the
PrimeMaster killed during a role failover, `dlu debug`, and a chaos run with a fault at every
tier (the SubMaster, i.e. the ElasticMaster, is killed there).
"""

from __future__ import annotations

import functools
import os
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from lm_jobs import lm_job, status_of, wait_until
from side_by_side import outcome, run_checks

from dlu_api.spec import spec_from_dict

pytestmark = [pytest.mark.ray, pytest.mark.slow, pytest.mark.timeout(420)]

HERE = Path(__file__).parent


def step_of(name: str, actor: str) -> int:
    status = status_of(name)
    if status is None:
        return -1
    for role in status.roles:
        for a in role.actors:
            if a.name == actor:
                return a.step or -1
    return -1


def recovered(job: str, tier: str) -> bool:
    status = status_of(job)
    return status is not None and any(e.kind == "failover_done" and e.tier == tier for e in status.events)


def kill_actor(actor: str) -> int:
    """SIGKILL the process of a DLU actor (Ray then reconstructs it)."""
    import ray

    from dlu_prime.naming import NAMESPACE

    handle = ray.get_actor(actor, namespace=NAMESPACE)
    pid = int(ray.get(handle.status.remote(), timeout=30)["pid"])
    os.kill(pid, signal.SIGKILL)
    return pid


def kill_master(job: str) -> None:
    import ray

    from dlu_prime.naming import NAMESPACE, master_name

    pid = int(ray.get(ray.get_actor(master_name(job), namespace=NAMESPACE).ping.remote(), timeout=30)["pid"])
    os.kill(pid, signal.SIGKILL)


def final_loss(ckpt: Path) -> str:
    return (ckpt / "final_loss.txt").read_text()


@pytest.fixture(scope="module")
def clean_loss(ray_session: Any, tmp_path_factory: pytest.TempPathFactory) -> str:
    from dlu_prime import launcher

    ckpt = tmp_path_factory.mktemp("clean")
    # unpaced (step_s pads each step and changes no loss): no fault has to land in this run
    status = launcher.run_job(lm_job("fo-clean", ckpt, step_s=0.0), str(HERE))
    assert status.exit_code == 0, status.reason
    return final_loss(ckpt)


def _actor_killed_twice(clean_loss: str, tmp_path: Path) -> None:
    """Tier 2: Ray reconstructs the killed ElasticWorker, it reports RESTARTED, the ElasticMaster
    replaces it through restart_actors, and every rank trains again; twice in a row."""
    from dlu_prime import launcher

    spec = lm_job("fo-actor", tmp_path)
    launcher.submit_job(spec, str(HERE))
    victim = "fo-actor.trainer.1"
    for at_step in (8, 18):
        wait_until(f"step {at_step}", lambda s=at_step: step_of(spec.name, victim) >= s)
        kill_actor(victim)
    status = launcher.wait_job(spec)

    assert status.exit_code == 0, status.reason
    done = [e for e in status.events if e.kind == "failover_done"]
    assert [e.tier for e in done] == ["role", "role"], [e.message for e in status.events]
    assert all(e.duration_s is not None for e in done)
    actors = {a.name: a for a in status.roles[0].actors}
    assert actors[victim].restart_count == 2 and actors["fo-actor.trainer.0"].restart_count == 0
    assert status.roles[0].restart_count == 2
    assert final_loss(tmp_path) == clean_loss


def _job_level(clean_loss: str, tmp_path: Path) -> None:
    """Tier 3: a simple role has no SubMaster, so its failure restarts the whole job."""
    del clean_loss, tmp_path  # the check's own job needs neither
    from dlu_prime import launcher

    spec = spec_from_dict(
        {
            "name": "fo-job",
            "device_type": "CPU",
            "device_per_node": 0,
            "health": {"monitor_interval_s": 0.2},
            "config": {"steps": 100},
            "roles": [
                {"name": "worker", "entrypoint": "workloads:steps_with_progress", "total": 2},
                {"name": "helper", "entrypoint": "workloads:forever", "is_driver": False},
            ],
        }
    )
    launcher.submit_job(spec, str(HERE))
    wait_until("step 5", lambda: step_of(spec.name, "fo-job.worker.0") >= 5)
    kill_actor("fo-job.helper.0")
    status = launcher.wait_job(spec)

    assert status.exit_code == 0, status.reason
    assert status.job_restart_count == 1 and status.global_restart_count == 1
    tiers = [e.tier for e in status.events if e.kind == "failover_done"]
    assert tiers == ["job"]
    stages = [e.message.split(":")[0] for e in status.events if e.kind == "stage"]
    assert stages[-5:] == [
        "RUNNING -> INIT",
        "INIT -> READY",
        "READY -> RUNNING",
        "RUNNING -> STOPPING",
        "STOPPING -> STOPPED",
    ]


def _debug(clean_loss: str, tmp_path: Path) -> None:
    del clean_loss, tmp_path  # the check's own job needs neither
    from dlu_prime import launcher

    spec = spec_from_dict(
        {
            "name": "fo-debug",
            "device_type": "CPU",
            "device_per_node": 0,
            "health": {"monitor_interval_s": 0.2},
            "config": {"steps": 40},
            "roles": [
                {
                    "name": "worker",
                    "entrypoint": "workloads:steps_with_progress",
                    "recovery": "in_place",
                }
            ],
        }
    )
    launcher.submit_job(spec, str(HERE))
    wait_until("step 3", lambda: step_of(spec.name, "fo-debug.worker.0") >= 3)
    steps = launcher.debug_job(spec.name, "get_step", "worker")
    assert int(steps["fo-debug.worker.0"]) >= 3
    with pytest.raises(ValueError, match="no role 'nope'"):
        launcher.debug_job(spec.name, "get_step", "nope")
    launcher.debug_job(spec.name, "mark_unhealthy", "worker", 0)
    status = launcher.wait_job(spec)
    assert status.exit_code == 0, status.reason
    reports = [e for e in status.events if e.kind == "error_report"]
    assert reports and "dlu debug" in reports[0].message
    assert [e.tier for e in status.events if e.kind == "failover_done"] == ["role"]


def _chaos(clean_loss: str, tmp_path: Path) -> None:
    """Faults at chosen steps: a training process (tier 1), an ElasticWorker actor (tier 2), the
    ElasticMaster (tier 5) and the PrimeMaster (tier 6). Same final loss as a fault-free run."""
    from dlu_prime import launcher

    spec = lm_job("fo-chaos", tmp_path, extra_args="--crash-at-step 4 --crash-rank 1", step_s=0.5)
    launcher.submit_job(spec, str(HERE))
    rank0 = "fo-chaos.trainer.0"
    wait_until("step 8", lambda: step_of(spec.name, rank0) >= 8)
    kill_actor("fo-chaos.trainer.1")
    wait_until("the role failover", lambda: recovered(spec.name, "role"))
    at = step_of(spec.name, rank0)
    wait_until("training again", lambda: step_of(spec.name, rank0) >= at + 2)
    kill_actor("fo-chaos.trainer.submaster")
    wait_until("the SubMaster failover", lambda: recovered(spec.name, "sub_master"))
    at = step_of(spec.name, rank0)
    wait_until("training again", lambda: step_of(spec.name, rank0) >= at + 2)
    kill_master(spec.name)
    status = launcher.wait_job(spec)

    assert status.exit_code == 0, status.reason
    kinds = [e.kind for e in status.events]
    assert "inplace_restart" in kinds
    assert [e.tier for e in status.events if e.kind == "failover_done"] == ["in_place", "role", "sub_master"]
    assert "master_restarted" in kinds and status.master_restart_count == 1
    assert final_loss(tmp_path) == clean_loss


def _overlap(clean_loss: str, tmp_path: Path) -> None:
    """Tier 6 over tier 2: the PrimeMaster dies while a role failover is in flight; the new one
    loads the saved failover and finishes it without counting it twice."""
    from dlu_prime import launcher

    # A slow actor setup keeps the failover in flight long enough to kill the PrimeMaster in it.
    spec = lm_job("fo-overlap", tmp_path, role={"env": {"DLU_FAULT_SETUP_DELAY_S": "3"}})
    launcher.submit_job(spec, str(HERE))
    wait_until("step 8", lambda: step_of(spec.name, "fo-overlap.trainer.0") >= 8)
    kill_actor("fo-overlap.trainer.1")

    def in_flight() -> bool:
        status = status_of(spec.name)
        return status is not None and any(e.kind == "failover_started" for e in status.events)

    wait_until("the role failover to start", in_flight)
    kill_master(spec.name)
    status = launcher.wait_job(spec)

    assert status.exit_code == 0, status.reason
    assert status.master_restart_count == 1
    assert any("role failover in flight" in e.message for e in status.events if e.kind == "master_restarted")
    assert [e.kind for e in status.events if e.kind.startswith("failover_")] == [
        "failover_started",
        "failover_done",
    ]
    actors = {a.name: a for a in status.roles[0].actors}
    assert actors["fo-overlap.trainer.1"].restart_count == 1 and status.roles[0].restart_count == 1
    assert final_loss(tmp_path) == clean_loss


Check = Callable[[str, Path], None]
# longest first; each its own job, named apart, its faults aimed at its own actors
SIDE_BY_SIDE: dict[str, Check] = {
    "chaos": _chaos,
    "overlap": _overlap,
    "actor": _actor_killed_twice,
    "job": _job_level,
    "debug": _debug,
}


@pytest.fixture(scope="module")
def side_by_side(
    clean_loss: str, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, BaseException | None]:
    """The checks run side by side, three at a time (a PrimeMaster takes 1 of the session Ray's 8
    CPUs): a job's time is mostly its paced steps and its recoveries' waits, which the others
    fill. What each check raised, its test raises."""
    checks = {name: functools.partial(check, clean_loss) for name, check in SIDE_BY_SIDE.items()}
    return run_checks(checks, tmp_path_factory, at_once=3)


def test_failover_training_actor_killed_twice_in_one_role(
    side_by_side: dict[str, BaseException | None],
) -> None:
    outcome(side_by_side, "actor")


def test_job_level_failover_of_a_role_without_sub_master(
    side_by_side: dict[str, BaseException | None],
) -> None:
    outcome(side_by_side, "job")


def test_debug_mark_unhealthy_triggers_a_recovery_and_steps_are_readable(
    side_by_side: dict[str, BaseException | None],
) -> None:
    outcome(side_by_side, "debug")


def test_chaos_reference_job_survives_a_fault_at_every_tier(
    side_by_side: dict[str, BaseException | None],
) -> None:
    outcome(side_by_side, "chaos")


def test_manager_failover_primemaster_killed_during_a_role_failover(
    side_by_side: dict[str, BaseException | None],
) -> None:
    outcome(side_by_side, "overlap")
