"""One fault, one recovery, on the right culprit; every stop says why. Real faults on a real Ray.

- an ElasticWorker actor SIGKILLed: the surviving ranks' collectives fail too, but only the
  killed actor's death is counted (a role restart), never an in-place restart of a healthy rank;
  at `max_restart` the stop reason names the limit and the killed actor;
- a training process that hangs (SIGSTOP): its own rank's agent finds it and it is restarted in
  place, blamed on that rank; so is a restarted one that hangs before its first heartbeat;
- the PrimeMaster killed past `master_max_restart`: the reason names the limit, and the final
  status, stored too, lists no actor as running;
- the ElasticMaster killed during the node check: Ray rebuilt it, so it is checked again within
  its role's budget, and the job trains.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

import pytest
from lm_jobs import lm_job, status_of, wait_until
from side_by_side import outcome, run_checks

from dlu_api.status import JobStatus

pytestmark = [pytest.mark.ray, pytest.mark.slow, pytest.mark.timeout(420)]

HERE = Path(__file__).parent
RECOVERIES = frozenset({"inplace_restart", "failover_started", "master_restarted", "node_relaunch"})


def actor_status(actor: str) -> dict[str, Any]:
    import ray

    from dlu_prime.naming import NAMESPACE

    return dict(ray.get(ray.get_actor(actor, namespace=NAMESPACE).status.remote(), timeout=30))


def step_of(job: str, actor: str) -> int:
    status = status_of(job)
    found = [a.step for r in (status.roles if status else []) for a in r.actors if a.name == actor]
    return (found[0] or -1) if found else -1


def kill_pid(pid: int) -> None:
    os.kill(pid, signal.SIGKILL)


def kill_master(job: str) -> None:
    import ray

    from dlu_prime.naming import NAMESPACE, master_name

    found: Any = ray.get(ray.get_actor(master_name(job), namespace=NAMESPACE).ping.remote(), timeout=60)
    kill_pid(int(found["pid"]))


def recoveries(status: JobStatus) -> list[tuple[str, str | None, str | None]]:
    return [(e.kind, e.tier, e.actor) for e in status.events if e.kind in RECOVERIES]


def test_killed_rank_actor_counted_once_on_it_and_named_at_the_limit(
    ray_session: Any, tmp_path: Path
) -> None:
    """max_restart=2, three SIGKILLs of trainer.1's actor: two role restarts blamed on it, no
    in-place restart of anyone, and the third stops the job naming the limit and trainer.1."""
    from dlu_prime import launcher

    spec = lm_job("acct-kill", tmp_path, steps=400, step_s=0.1, role={"max_restart": 2})
    victim, peer = "acct-kill.trainer.1", "acct-kill.trainer.0"
    launcher.submit_job(spec, str(HERE))
    for kill in range(3):
        at = max(step_of(spec.name, peer), 0)
        wait_until(f"training before kill {kill + 1}", lambda a=at: step_of(spec.name, peer) >= a + 5)
        kill_pid(int(actor_status(victim)["pid"]))
        if kill < 2:
            wait_until(f"recovery {kill + 1}", lambda k=kill: _count(spec.name, "failover_done") > k)
    status = launcher.wait_job(spec)

    assert status.exit_code == 1
    first = status.reason.splitlines()[0]
    assert first.startswith("role trainer reached max_restart=2; culprit: acct-kill.trainer.1"), status.reason
    assert recoveries(status) == [("failover_started", "role", victim)] * 2, recoveries(status)
    role = status.roles[0]
    assert role.restart_count == 2 and role.inplace_restart_count == 0
    assert not [a.name for a in role.actors if a.stage == "RUNNING"]


def _hung(tmp_path: Path) -> None:
    from dlu_prime import launcher

    health = {"monitor_interval_s": 0.2, "heartbeat_interval_s": 0.5, "heartbeat_timeout_s": 3.0}
    spec = lm_job("acct-hang", tmp_path, steps=80, step_s=0.1, health=health)
    victim = "acct-hang.trainer.1"
    launcher.submit_job(spec, str(HERE))
    wait_until("step 10", lambda: step_of(spec.name, victim) >= 10)
    process = actor_status(victim)["process_pid"]
    assert process is not None
    os.kill(int(process), signal.SIGSTOP)  # alive, silent: a hang
    status = launcher.wait_job(spec)

    assert status.exit_code == 0, status.reason
    assert recoveries(status) == [("inplace_restart", "in_place", victim)], recoveries(status)
    (event,) = [e for e in status.events if e.kind == "inplace_restart"]
    assert "no heartbeat" in event.message
    with pytest.raises(ProcessLookupError):  # the hung process was killed, not left behind
        os.kill(int(process), 0)


def _hung_before_first_beat(tmp_path: Path) -> None:
    """trainer.1's process is killed at step 10 (one in-place restart); its next process stops
    itself before its first heartbeat: its agent knows the script beats, finds it silent from
    its start, and restarts it in place, blamed on trainer.1 again, not on the waiting peer."""
    from dlu_prime import launcher

    health = {"monitor_interval_s": 0.2, "heartbeat_interval_s": 0.5, "heartbeat_timeout_s": 3.0}
    env = {"HANG_MARK_DIR": str(tmp_path), "HANG_RANK": "1"}
    script = HERE / "hang_at_restart.py"
    spec = lm_job(
        "acct-first", tmp_path, steps=80, step_s=0.1, health=health, script=script, role={"env": env}
    )
    victim = "acct-first.trainer.1"
    launcher.submit_job(spec, str(HERE))
    wait_until("step 10", lambda: step_of(spec.name, victim) >= 10)
    kill_pid(int(actor_status(victim)["process_pid"]))
    status = launcher.wait_job(spec)

    assert status.exit_code == 0, status.reason
    assert (tmp_path / "hung-once").exists()
    assert recoveries(status) == [("inplace_restart", "in_place", victim)] * 2, recoveries(status)
    second = [e for e in status.events if e.kind == "inplace_restart"][1]
    assert "no first heartbeat" in second.message, second.message


@pytest.fixture(scope="module")
def hangs(ray_session: Any, tmp_path_factory: pytest.TempPathFactory) -> dict[str, BaseException | None]:
    """The two hang checks, side by side (each its own job, named apart, its SIGSTOP or SIGKILL
    aimed at its own rank's process): a job's time is mostly its paced steps and the 3 s
    heartbeat timeout it waits out. What each check raised, its test raises."""
    checks = {"hung": _hung, "first_beat": _hung_before_first_beat}
    return run_checks(checks, tmp_path_factory, at_once=len(checks))


def test_hung_training_process_is_restarted_in_place_blamed_on_its_rank(
    hangs: dict[str, BaseException | None],
) -> None:
    outcome(hangs, "hung")


def test_restarted_process_hung_before_its_first_beat_is_found_on_its_rank(
    hangs: dict[str, BaseException | None],
) -> None:
    outcome(hangs, "first_beat")


def test_primemaster_past_its_limit_names_the_limit_and_nothing_stays_running(
    ray_session: Any, tmp_path: Path
) -> None:
    from dlu_prime import launcher

    spec = lm_job("acct-master", tmp_path, steps=600, step_s=0.1, limits={"master_max_restart": 2})
    launcher.submit_job(spec, str(HERE))
    for kill in range(3):
        wait_until(f"monitoring before kill {kill + 1}", lambda k=kill: _master_restarts(spec.name) == k)
        wait_until("training", lambda: step_of(spec.name, "acct-master.trainer.0") >= 3)
        kill_master(spec.name)
    status = launcher.wait_job(spec)

    assert status.exit_code == 1
    assert status.reason.startswith("master_max_restart=2 reached: the PrimeMaster died 3 time(s)"), (
        status.reason
    )
    assert "last stage RUNNING" in status.reason
    assert not [a.name for r in status.roles for a in r.actors if a.stage == "RUNNING"]
    stored = launcher.stored_status(spec.name, spec.state_store.name, spec.state_store.options)
    assert stored is not None and stored.stage == "STOPPED" and stored.reason == status.reason
    import ray

    named: list[Any] = ray.util.list_named_actors(all_namespaces=True)
    assert [a for a in named if str(a["name"]).startswith(spec.name)] == []


def _count(job: str, kind: str) -> int:
    status = status_of(job)
    return len([e for e in status.events if e.kind == kind]) if status is not None else -1


def _master_restarts(job: str) -> int:
    status = status_of(job)
    return status.master_restart_count if status is not None and status.stage == "RUNNING" else -1


def test_elastic_master_killed_during_the_node_check_is_checked_again(
    ray_session: Any, tmp_path: Path
) -> None:
    from dlu_prime import launcher

    check = {"enabled": True, "matmul_size": 1024, "allreduce_mb": 256.0}
    spec = lm_job("acct-check", tmp_path, steps=20, step_s=0.0, elastic={"node_check": check})
    sub = "acct-check.trainer.submaster"
    launcher.submit_job(spec, str(HERE))
    wait_until("the ElasticMaster set up", lambda: _stage_of(sub) == "READY", timeout_s=120)
    kill_pid(int(actor_status(sub)["pid"]))
    status = launcher.wait_job(spec)

    assert status.exit_code == 0, status.reason
    assert recoveries(status) == [("failover_started", "sub_master", sub)], recoveries(status)
    assert any(e.kind == "node_check" for e in status.events)


def _stage_of(actor: str) -> str | None:
    try:
        return str(actor_status(actor)["stage"])
    except Exception:
        return None
