"""`ray.kill` of an ElasticWorker actor, with and without a restart (real Ray, real training).

The actor's process ends without a signal from the test (Ray's own kill path), so these check
what a user's `ray.kill` does: the training process forked for the killed agent (a child of the
node's zygote, not of the actor) must end with it, the death must be noticed and counted once
on the killed actor, and the job must go on training.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

import pytest
from lm_jobs import lm_job, status_of, wait_until

pytestmark = [pytest.mark.ray, pytest.mark.slow, pytest.mark.timeout(420)]

HERE = Path(__file__).parent
RECOVERIES = frozenset({"inplace_restart", "failover_started", "master_restarted", "node_relaunch"})


def _handle(actor: str) -> Any:
    import ray

    from dlu_prime.naming import NAMESPACE

    return ray.get_actor(actor, namespace=NAMESPACE)


def _status(actor: str) -> dict[str, Any]:
    import ray

    return dict(ray.get(_handle(actor).status.remote(), timeout=30))


def _step(job: str, actor: str) -> int:
    status = status_of(job)
    found = [a.step for r in (status.roles if status else []) for a in r.actors if a.name == actor]
    return (found[0] or -1) if found else -1


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] == "Z"


@pytest.mark.parametrize(
    ("no_restart", "stopped"),
    [(False, False), (True, False), (False, True)],
    ids=["restart", "no_restart", "process_stopped"],
)
@pytest.mark.parametrize("steps", [25, pytest.param(150, marks=pytest.mark.soak)], ids=["short", "long"])
def test_ray_kill_of_a_rank_actor_ends_its_process_and_is_recovered_once(
    ray_session: Any, tmp_path: Path, no_restart: bool, stopped: bool, steps: int
) -> None:
    """`process_stopped`: the training process is SIGSTOPped just before its agent is killed, so
    its own watch of the agent cannot run; the zygote that forked it must end it. The kill lands
    at step 5 either way (the peer waits on the killed rank); `long` trains 150 steps, not 25."""
    import ray

    from dlu_prime import launcher

    name = f"raykill-{'gone' if no_restart else 'back'}{'-stopped' if stopped else ''}-{steps}"
    spec = lm_job(name, tmp_path, steps=steps, step_s=0.1)
    victim, peer = f"{name}.trainer.1", f"{name}.trainer.0"
    launcher.submit_job(spec, str(HERE))
    wait_until("training", lambda: _step(name, peer) >= 5)
    before = _status(victim)
    actor_pid, process_pid = int(before["pid"]), int(before["process_pid"])
    if stopped:
        os.kill(process_pid, signal.SIGSTOP)
    ray.kill(_handle(victim), no_restart=no_restart)

    wait_until("the killed agent's training process ends", lambda: _gone(process_pid), 60)
    status = launcher.wait_job(spec)
    assert _gone(actor_pid)
    assert status.exit_code == 0, status.reason
    recoveries = [(e.kind, e.tier, e.actor) for e in status.events if e.kind in RECOVERIES]
    assert recoveries == [("failover_started", "role", victim)], recoveries
    role = status.roles[0]
    assert role.restart_count == 1 and role.inplace_restart_count == 0
