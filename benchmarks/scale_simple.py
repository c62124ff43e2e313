"""`dlu scale` of a simple role while the job runs: 4 -> 8 actors -> all 8 RUNNING, and back to 4.

A job of one driver role and a `workers` role of 4 simple actors (each loops with heartbeats) on
an embedded local Ray started first and not counted. Each cycle scales `workers` 4 -> 8 through
the PrimeMaster (what `dlu scale JOB workers 8` and `Job.scale` do) and times it until the
status shows 8 RUNNING workers, then back to 4; the 4 original actors must keep their processes.
Prints one line per cycle, then FIGURE lines (median of the cycles). Usage:
`uv run python benchmarks/scale_simple.py [cycles]` (default 3).
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from figures import compile_workspace, figure

from dlu_api.spec import spec_from_dict
from dlu_api.status import JobStage, JobStatus

ROOT = Path(__file__).resolve().parents[1]
BUDGET_S = 3.0  # DESIGN's table (docs/performance.md): simple role 4 -> 8 actors, all running
JOB = "bench-scale"


def job_spec() -> Any:
    def role(name: str, total: int, driver: bool) -> dict[str, Any]:
        return {
            "name": name,
            "entrypoint": "workloads:forever",
            "total": total,
            "is_driver": driver,
            "resources": {"cpu": 0.05},
        }

    return spec_from_dict(
        {
            "name": JOB,
            "device_type": "CPU",
            "device_per_node": 0,
            "roles": [role("trainer", 1, True), role("workers", 4, False)],
            "health": {"monitor_interval_s": 0.1},
        }
    )


def running_workers(job: str) -> list[Any]:
    from dlu_prime import launcher

    status: JobStatus | None = launcher.job_status(job)
    if status is None or status.stage is not JobStage.RUNNING:
        return []
    role = next(r for r in status.roles if r.name == "workers")
    return [a for a in role.actors if a.stage == "RUNNING" and a.rank >= 0]


def wait_for(size: int, job: str, timeout_s: float = 120.0) -> float:
    began = time.perf_counter()
    while len(running_workers(job)) != size:
        if time.perf_counter() - began > timeout_s:
            raise SystemExit(f"workers never reached {size} RUNNING within {timeout_s} s")
        time.sleep(0.01)
    return time.perf_counter() - began


def pids(job: str) -> dict[str, int]:
    import ray

    from dlu_prime.naming import NAMESPACE

    found: dict[str, int] = {}
    for actor in running_workers(job):
        answer: Any = ray.get(ray.get_actor(actor.name, namespace=NAMESPACE).status.remote(), timeout=30)
        found[actor.name] = int(answer["pid"])
    return found


def main(cycles: int) -> None:
    compile_workspace()
    os.environ["DLU_HOME"] = tempfile.mkdtemp(prefix="dlu-bench-home-", dir="/tmp")
    sys.path.insert(0, str(ROOT / "tests" / "integration"))  # workloads:forever
    from dlu_prime import launcher, ray_env

    ray_env.init_local(num_cpus=4, _temp_dir=tempfile.mkdtemp(prefix="dlu-bench-", dir="/tmp"))
    spec = job_spec()
    launcher.submit_job(spec, str(ROOT / "tests" / "integration"))
    wait_for(4, JOB)
    original = pids(JOB)
    grow: list[float] = []
    shrink: list[float] = []
    for cycle in range(cycles):
        began = time.perf_counter()
        launcher.scale_job(JOB, "workers", 8)
        wait_for(8, JOB)
        grow.append(time.perf_counter() - began)
        began = time.perf_counter()
        launcher.scale_job(JOB, "workers", 4)
        wait_for(4, JOB)
        shrink.append(time.perf_counter() - began)
        kept = pids(JOB)
        touched = sorted(n for n, pid in original.items() if kept.get(n) != pid)
        print(
            f"cycle {cycle}: 4 -> 8 running {grow[-1]:.2f} s, 8 -> 4 {shrink[-1]:.2f} s, "
            f"original actors restarted: {touched or 'none'}",
            flush=True,
        )
        if touched:
            raise SystemExit(f"scaling restarted actors it should not touch: {touched}")
    launcher.stop_job(JOB)
    launcher.wait_job(spec)
    figure(
        "scale_simple_4_to_8",
        statistics.median(grow),
        "s",
        BUDGET_S,
        label=f"dlu scale of a simple role 4 -> 8 actors -> all 8 running (median of {cycles})",
    )
    figure(
        "scale_simple_8_to_4",
        statistics.median(shrink),
        "s",
        label=f"dlu scale of a simple role 8 -> 4 actors -> 4 running (median of {cycles})",
    )


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 3)
