"""Failover times on the reference job (char-level LM, 2 nodes x 2 processes, CPU, gloo) on an
embedded local Ray: from the fault to every rank training again, per tier; and PrimeMaster
killed while RUNNING -> monitoring resumed, with the number of worker restarts it caused.

Faults (one job, at chosen steps): a training process raises (tier 1, in place); an
ElasticWorker actor is SIGKILLed (tier 2, role); the ElasticMaster is SIGKILLed (tier 5); the
PrimeMaster is SIGKILLed (tier 6). "Training again" means every rank reported a new step after
the recovery. Usage: `uv run python benchmarks/failover.py [--in-place-only]` (only tier 1: its
three restarts, then the job is stopped).
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from figures import compile_workspace, figure
from reference import ROOT, fresh_status, reference_spec, status, wait

# DESIGN section 9; the SubMaster tier has no budget there (reported, not judged).
BUDGETS: dict[str, float | None] = {"in_place": 0.25, "role": 2.0, "sub_master": None, "master": 1.0}


# Checkpoint steps (the restarted processes resume there, the old ones never pass them), one
# in-place restart each: the tier's figure is their median, as the other tiers' benchmarks give.
CRASH_STEPS = (15, 30, 45)


def spec(ckpt: Path) -> Any:
    return reference_spec(
        "bench-failover",
        f"--steps 400 --step-seconds 0.1 --checkpoint-every 5 --checkpoint-dir {ckpt} "
        f"--crash-at-step {','.join(map(str, CRASH_STEPS))} --crash-rank 1",
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


def in_place_done(job: str, crash_at: int, crashed_wall: float) -> float:
    """Seconds from the crash (wall clock) to the moment the job's timeline recorded every rank
    training again after the in-place restart: the ElasticMaster's `failover_done` event, sent
    when the last rank's first step of the new round reached it (`inplace_timer.py`), stamped by
    the PrimeMaster that recorded it. The event carries its own time, so it is looked for every
    0.1 s: polling the status every 20 ms instead cost the PrimeMaster and this process CPU taken
    from the restart being timed, and added up to 20 ms of its own. Checks that every rank's
    step then passed the crash step (only restarted processes pass it)."""
    found: list[Any] = []

    def recorded() -> bool:
        current = status(job)
        done = (
            []
            if current is None
            else [
                e
                for e in current.events
                if e.kind == "failover_done" and e.tier == "in_place" and e.time > crashed_wall
            ]
        )
        found.extend(done[:1])
        return bool(done)

    wait("the in-place restart's end on the timeline", recorded, every=0.1)
    wait("every rank past the crash step", lambda: all(s > crash_at for s in steps(status(job)).values()))
    return found[0].time - crashed_wall


def pid_of(actor: str, method: str = "status") -> int:
    import ray

    from dlu_prime.naming import NAMESPACE

    handle = ray.get_actor(actor, namespace=NAMESPACE)
    found: dict[str, Any] = ray.get(getattr(handle, method).remote(), timeout=30)
    return int(found["pid"])


def main() -> None:
    """Runs the tiers in a private Ray and checkpoint folder, both removed at the end (a
    `RAY_TMPDIR` given by the caller is the caller's and stays)."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--in-place-only", action="store_true", help="measure tier 1 alone")
    args = parser.parse_args()
    compile_workspace()
    made: list[Path] = []
    if "RAY_TMPDIR" not in os.environ:
        made.append(Path(tempfile.mkdtemp(prefix="dlu-bf-", dir="/tmp")))
        os.environ["RAY_TMPDIR"] = str(made[-1])
    made.append(Path(tempfile.mkdtemp(prefix="dlu-bf-ckpt-")))
    try:
        measure(made[-1], in_place_only=args.in_place_only)
    finally:
        import ray

        ray.shutdown()  # Ray's processes write into RAY_TMPDIR until they end
        for folder in made:
            shutil.rmtree(folder, ignore_errors=True)


def measure(ckpt: Path, in_place_only: bool = False) -> None:
    from dlu_prime import launcher, ray_env
    from dlu_prime.naming import master_name

    ray_env.init_local(num_cpus=8)
    job = spec(ckpt)
    launcher.submit_job(job, str(ROOT))
    name = job.name
    results: dict[str, float] = {}

    # tier 1: the training process of rank 1 raises at each crash step (its marker file holds
    # the time of the crash)
    in_place: list[float] = []
    for crash_at in CRASH_STEPS:
        marker = ckpt / f"crashed-at-{crash_at}"
        wait("the injected crash", marker.exists, every=0.005)
        wait("the crash time in the marker", lambda m=marker: bool(m.read_text().strip()), every=0.005)
        in_place.append(in_place_done(name, crash_at, float(marker.read_text())))
    results["in_place"] = statistics.median(in_place)
    print(
        "in-place restarts, crash -> every rank training again: " + ", ".join(f"{s:.3f} s" for s in in_place)
    )
    if in_place_only:
        launcher.stop_job(name)
        launcher.wait_job(job)
        report(results, None)
        return

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
    report(results, worker_restarts)


def report(results: dict[str, float], worker_restarts: int | None) -> None:
    """Each measured tier against its budget, then its FIGURE lines (benchmarks/figures.py)."""
    print("failover on the reference job (2 nodes x 2 processes, CPU, gloo):")
    for tier, seconds in results.items():
        budget = BUDGETS[tier]
        verdict = (
            "no budget"
            if budget is None
            else f"budget {budget} s, " + ("ok" if seconds <= budget else "OVER")
        )
        print(f"  {tier:<10} fault -> all ranks training again: {seconds:6.2f} s ({verdict})")
    if worker_restarts is not None:
        print(f"  PrimeMaster restart caused {worker_restarts} worker restart(s) (budget 0)")
    labels = {
        "in_place": "training-process crash -> all ranks training again (in-place tier, median of 3)",
        "role": "ElasticWorker actor killed -> training again (role tier)",
        "sub_master": "ElasticMaster killed -> training again (SubMaster tier)",
        "master": "PrimeMaster killed while RUNNING -> monitoring resumed",
    }
    for tier, seconds in results.items():
        figure(f"failover_{tier}", seconds, "s", BUDGETS[tier], labels[tier])
    if worker_restarts is not None:
        figure(
            "master_restart_worker_restarts",
            worker_restarts,
            "",
            0,
            "worker restarts caused by a PrimeMaster restart",
        )


if __name__ == "__main__":
    sys.exit(main())
