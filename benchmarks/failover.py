"""Failover times on the reference job (char-level LM, 2 nodes x 2 processes, CPU, gloo) on an
embedded local Ray: from the fault to every rank training again, per tier; and PrimeMaster
killed while RUNNING -> monitoring resumed, with the number of worker restarts it caused.

Faults (one job, at chosen steps): a training process raises (tier 1, in place); an
ElasticWorker actor is SIGKILLed (tier 2, role); the ElasticMaster is SIGKILLed (tier 5); the
PrimeMaster is SIGKILLed (tier 6). "Training again" means every rank reported a new step after
the recovery. Usage: `uv run python benchmarks/failover.py`.
"""

from __future__ import annotations

import os
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from figures import compile_workspace, figure
from reference import ROOT, fresh_status, reference_spec, status, wait

# DESIGN section 9; the SubMaster tier has no budget there (reported, not judged).
BUDGETS: dict[str, float | None] = {"in_place": 0.25, "role": 2.0, "sub_master": None, "master": 1.0}


def spec(ckpt: Path, crash_at: int) -> Any:
    return reference_spec(
        "bench-failover",
        f"--steps 400 --step-seconds 0.1 --checkpoint-every 5 --checkpoint-dir {ckpt} "
        f"--crash-at-step {crash_at} --crash-rank 1",
    )


def steps(current: Any) -> dict[str, int]:
    """Each rank's last step in a status (-1: none yet)."""
    return {a.name: a.step if a.step is not None else -1 for a in current.roles[0].actors if a.rank >= 0}


def training_again(job: str, events_before: int, kinds: set[str], beyond: int | None = None) -> float:
    """Time when, after a recovery event, every rank reported a new step.

    A new step is one past `beyond` when it is given: the step the crash happened at, which only
    the restarted processes can pass. Without it, a step that differs from the one the status
    showed when the event was first seen (the ranks' reports reach the status a heartbeat late,
    so a snapshot taken right at a fault can hold a step the old processes still report).
    """
    seen: dict[str, int] = {}

    def recovered() -> bool:
        current = status(job)
        if current is None or not any(e.kind in kinds for e in current.events[events_before:]):
            return False
        now = steps(current)  # the same answer: one status call per look (each costs the CPU it times)
        if beyond is not None:
            return len(now) == 4 and all(step > beyond for step in now.values())
        if not seen:
            seen.update(now)
            return False
        return len(now) == 4 and all(now[n] != seen.get(n) and now[n] > 0 for n in now)

    return wait("training again", recovered)


def ranks_past(job: str, step: int) -> float:
    """Time when every rank reported a step past `step` (the crash step: only restarted processes
    pass it), then checks that the restart was the in-place tier's.

    Steps are read with the PrimeMaster's `get_step` debug call, what `dlu debug get_step`
    shows (the same figures as the status): a full status every 20 ms cost the PrimeMaster and
    this process a few milliseconds of CPU each, taken from the restart being timed."""
    import ray

    from dlu_prime import launcher

    master = launcher.get_master(job)
    assert master is not None, f"job {job} has no PrimeMaster"

    def recovered() -> bool:
        now: dict[str, int | None] = ray.get(master.debug.remote("get_step", "trainer"), timeout=30)
        return len(now) == 4 and all(s is not None and s > step for s in now.values())

    at = wait("training again", recovered)
    final = status(job)
    if final is None or not any(e.kind == "inplace_restart" for e in final.events):
        raise SystemExit("the ranks trained again, but the job recorded no in-place restart")
    return at


def pid_of(actor: str, method: str = "status") -> int:
    import ray

    from dlu_prime.naming import NAMESPACE

    handle = ray.get_actor(actor, namespace=NAMESPACE)
    found: dict[str, Any] = ray.get(getattr(handle, method).remote(), timeout=30)
    return int(found["pid"])


def main() -> None:
    compile_workspace()
    from dlu_prime import launcher, ray_env
    from dlu_prime.naming import master_name

    os.environ.setdefault("RAY_TMPDIR", tempfile.mkdtemp(prefix="dlu-bf-", dir="/tmp"))
    ray_env.init_local(num_cpus=8)
    ckpt = Path(tempfile.mkdtemp(prefix="dlu-bf-ckpt-"))
    crash_at = 15  # a checkpoint step: the restarted processes resume there, the old ones never pass it
    job = spec(ckpt, crash_at)
    launcher.submit_job(job, str(ROOT))
    name = job.name
    results: dict[str, float] = {}

    # tier 1: the training process of rank 1 raises at step 15 (marker file = fault time)
    marker = ckpt / f"crashed-at-{crash_at}"
    wait("the injected crash", marker.exists, every=0.005)
    fault_mono = time.monotonic() - (time.time() - marker.stat().st_mtime)
    results["in_place"] = ranks_past(name, crash_at) - fault_mono

    # tier 2: SIGKILL an ElasticWorker actor
    time.sleep(2.0)
    before = len(status(name).events)
    os.kill(pid_of(f"{name}.trainer.3"), signal.SIGKILL)
    fault_mono = time.monotonic()
    results["role"] = training_again(name, before, {"failover_done"}) - fault_mono

    # tier 5: SIGKILL the ElasticMaster
    time.sleep(2.0)
    before = len(status(name).events)
    os.kill(pid_of(f"{name}.trainer.submaster"), signal.SIGKILL)
    fault_mono = time.monotonic()
    results["sub_master"] = training_again(name, before, {"failover_done"}) - fault_mono

    # tier 6: SIGKILL the PrimeMaster; monitoring resumed = it answers with the restart recorded
    time.sleep(2.0)
    restarts_before = sum(a.restart_count for a in status(name).roles[0].actors)
    os.kill(pid_of(master_name(name), "ping"), signal.SIGKILL)
    fault_mono = time.monotonic()

    def resumed() -> bool:
        current = fresh_status(name)  # not a call stranded on the killed process (see there)
        return current is not None and current.master_restart_count == 1

    results["master"] = wait("PrimeMaster back", resumed, every=0.05) - fault_mono
    after = status(name)
    worker_restarts = sum(a.restart_count for a in after.roles[0].actors) - restarts_before
    launcher.stop_job(name)
    launcher.wait_job(job)

    print("failover on the reference job (2 nodes x 2 processes, CPU, gloo):")
    for tier, seconds in results.items():
        budget = BUDGETS[tier]
        verdict = (
            "no budget"
            if budget is None
            else f"budget {budget} s, " + ("ok" if seconds <= budget else "OVER")
        )
        print(f"  {tier:<10} fault -> all ranks training again: {seconds:6.2f} s ({verdict})")
    print(f"  PrimeMaster restart caused {worker_restarts} worker restart(s) (budget 0)")
    labels = {
        "in_place": "training-process crash -> all ranks training again (in-place tier)",
        "role": "ElasticWorker actor killed -> training again (role tier)",
        "sub_master": "ElasticMaster killed -> training again (SubMaster tier)",
        "master": "PrimeMaster killed while RUNNING -> monitoring resumed",
    }
    for tier, seconds in results.items():
        figure(f"failover_{tier}", seconds, "s", BUDGETS[tier], labels[tier])
    figure(
        "master_restart_worker_restarts",
        worker_restarts,
        "",
        0,
        "worker restarts caused by a PrimeMaster restart",
    )


if __name__ == "__main__":
    sys.exit(main())
