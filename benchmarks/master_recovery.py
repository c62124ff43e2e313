"""PrimeMaster killed while RUNNING -> monitoring resumed, on the reference job (char-level LM,
2 nodes x 2 processes, CPU, gloo) on an embedded local Ray, with the worker restarts it caused.

The PrimeMaster is SIGKILLed several times while the job trains; Ray reconstructs it and it
self-recovers from the saved state. Per kill, two times from the SIGKILL: "answers" (its status
shows the restart recorded, the figure of `failover.py`) and "monitoring" (its status also
carries every rank's training step, which only a monitoring pass of the new PrimeMaster fills
in). The phases in between come from the timeline and the new process: when the new process
started (an idle prestarted worker shows a start before the kill) and when the saved state was
loaded (the `master_restarted` event). Prints one line per kill, the medians, then FIGURE lines.

Usage: `uv run python benchmarks/master_recovery.py [kills]` (default 5).
"""

from __future__ import annotations

import os
import signal
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

from figures import compile_workspace, figure
from reference import ROOT, fresh_status, reference_spec, status, wait

BUDGET_S = 1.0  # DESIGN section 9
RANKS = 4


@dataclass(frozen=True)
class Kill:
    """One SIGKILL of the PrimeMaster; every time is seconds after the kill."""

    answers_s: float
    monitoring_s: float
    process_s: float  # the new PrimeMaster process started (negative: a prestarted worker)
    state_loaded_s: float  # its `master_restarted` event


def spec(ckpt: Path, kills: int) -> Any:
    return reference_spec(
        "bench-master-recovery",
        f"--steps 100000 --step-seconds 0.1 --checkpoint-every 50 --checkpoint-dir {ckpt}",
        limits={"master_max_restart": kills + 1},
    )


def rank_steps(current: Any) -> dict[str, int]:
    return {a.name: a.step for a in current.roles[0].actors if a.rank >= 0 and a.step is not None}


def worker_restarts(current: Any) -> int:
    """Restarts of the role's actors and of its training processes (in place) so far."""
    role = current.roles[0]
    return sum(a.restart_count for a in role.actors) + role.inplace_restart_count


def master_pid(job: str) -> int:
    import ray

    from dlu_prime.naming import NAMESPACE, master_name

    handle = ray.get_actor(master_name(job), namespace=NAMESPACE)
    answer = cast(dict[str, Any], ray.get(handle.ping.remote(), timeout=30))
    return int(answer["pid"])


def process_start(pid: int) -> float:
    """Wall-clock start time of a process (Linux /proc; to the clock tick)."""
    start_ticks = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19])
    since_start = time.clock_gettime(time.CLOCK_BOOTTIME) - start_ticks / os.sysconf("SC_CLK_TCK")
    return time.time() - since_start


def kill_once(job: str, count: int) -> Kill:
    """SIGKILL the PrimeMaster and time its return (its `count`-th restart)."""
    old_pid = master_pid(job)
    os.kill(old_pid, signal.SIGKILL)
    killed = time.time()
    seen: list[Any] = []

    def answers() -> bool:
        current = fresh_status(job)
        if current is None or current.master_restart_count != count:
            return False
        seen.append(current)
        return True

    answered = wait("the PrimeMaster to answer", answers, every=0.05, clock=time.time)
    monitoring = wait(
        "the new PrimeMaster's first monitoring pass",
        lambda: (current := fresh_status(job)) is not None and len(rank_steps(current)) == RANKS,
        every=0.05,  # each unanswered call stays pending: do not pile them on the new PrimeMaster
        clock=time.time,
    )
    loaded = max(e.time for e in seen[0].events if e.kind == "master_restarted")
    new_pid = master_pid(job)
    if new_pid == old_pid:
        raise SystemExit("the PrimeMaster kept its pid: it was not killed")
    return Kill(answered - killed, monitoring - killed, process_start(new_pid) - killed, loaded - killed)


def main() -> int:
    compile_workspace()
    from dlu_prime import launcher, ray_env

    kills = int(sys.argv[1]) if len(sys.argv) > 1 else 5
    os.environ.setdefault("RAY_TMPDIR", tempfile.mkdtemp(prefix="dlu-bmr-", dir="/tmp"))
    ray_env.init_local(num_cpus=8)
    job = spec(Path(tempfile.mkdtemp(prefix="dlu-bmr-ckpt-")), kills)
    launcher.submit_job(job, str(ROOT))
    wait(
        "every rank training",
        lambda: (current := status(job.name)) is not None and len(rank_steps(current)) == RANKS,
        every=0.1,
    )
    restarts_before = worker_restarts(status(job.name))
    results: list[Kill] = []
    for count in range(1, kills + 1):
        time.sleep(2.0)
        result = kill_once(job.name, count)
        results.append(result)
        print(
            f"kill {count}: process start {result.process_s:+.2f} s, state loaded {result.state_loaded_s:.2f} s, "
            f"answers {result.answers_s:.2f} s, monitoring {result.monitoring_s:.2f} s",
            flush=True,
        )
    after = status(job.name)
    before_steps = rank_steps(after)
    time.sleep(1.0)
    still_training = all(rank_steps(status(job.name)).get(n, -1) > s for n, s in before_steps.items())
    restarts = worker_restarts(after) - restarts_before
    launcher.stop_job(job.name)
    launcher.wait_job(job)

    def median(field: str) -> float:
        return statistics.median(getattr(r, field) for r in results)

    print(
        f"median of {kills}: process start {median('process_s'):+.2f} s, state loaded "
        f"{median('state_loaded_s'):.2f} s, answers {median('answers_s'):.2f} s, monitoring "
        f"{median('monitoring_s'):.2f} s; {restarts} worker restart(s); "
        f"training {'went on' if still_training else 'DID NOT go on'} after the kills"
    )
    figure(
        "master_recovery_answers",
        median("answers_s"),
        "s",
        None,
        "PrimeMaster killed -> answers with its restart recorded (median)",
    )
    figure(
        "master_recovery",
        median("monitoring_s"),
        "s",
        BUDGET_S,
        "PrimeMaster killed while RUNNING -> monitoring resumed (median)",
    )
    figure(
        "master_recovery_worker_restarts",
        restarts,
        "",
        0,
        "worker restarts caused by PrimeMaster restarts",
    )
    return 0 if still_training else 2


if __name__ == "__main__":
    sys.exit(main())
