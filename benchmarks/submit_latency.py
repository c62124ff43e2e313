"""Submit -> RUNNING for a job of four simple workers, and submit -> first training step for
the reference job (one elastic role, 2 nodes x 2 processes, node check on).

The embedded Ray is started first and not counted: the figures are DLU's own cost. Prints one
line per run, the medians, then FIGURE lines (benchmarks/figures.py). Usage: `uv run python benchmarks/submit_latency.py [runs]`.
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

from dlu_api.spec import load_spec, spec_from_dict
from dlu_api.status import JobStage, JobStatus

ROOT = Path(__file__).resolve().parents[1]


def simple_job(run: int) -> Any:
    return spec_from_dict(
        {
            "name": f"bench-submit-{run}",
            "device_type": "CPU",
            "device_per_node": 0,
            "health": {"monitor_interval_s": 0.1},
            "roles": [
                {
                    "name": "worker",
                    "entrypoint": "examples.hello.workers:main",
                    "total": 4,
                    "resources": {"cpu": 0.25},
                },
            ],
            "config": {"steps": 1, "step_seconds": 0.0},
        }
    )


def reference_job(run: int, ckpt: str) -> Any:
    data = load_spec(ROOT / "examples/elastic/job.yaml").model_dump(mode="json")
    data["name"] = f"bench-ref-{run}"
    data["health"] = {"monitor_interval_s": 0.1}
    data["roles"][0]["entrypoint"] = f"examples/elastic/train_lm.py --steps 3 --checkpoint-dir {ckpt}"
    return spec_from_dict(data)


def timed(client: Any, spec: Any, reached: Any) -> tuple[float, float]:
    """(seconds until `reached(status)` first held, seconds until STOPPED), submitted as
    `Job.submit()` and `dlu run` submit (the local client), followed more closely than they do."""
    from dlu_prime import launcher

    t0 = time.perf_counter()
    client.submit(spec)
    hit: list[float] = []

    def seen(status: JobStatus) -> None:
        if not hit and reached(status):
            hit.append(time.perf_counter() - t0)

    final = launcher.wait_job(spec, seen, poll_interval_s=0.02)
    assert final.exit_code == 0, final.reason
    assert hit, "the condition was never observed"
    return hit[0], time.perf_counter() - t0


def running(status: JobStatus) -> bool:
    return status.stage in (JobStage.RUNNING, JobStage.STOPPING, JobStage.STOPPED)


def first_step(status: JobStatus) -> bool:
    return any((a.step or 0) >= 1 for r in status.roles for a in r.actors) or status.stage is JobStage.STOPPED


def main(runs: int = 3) -> None:
    compile_workspace()
    os.environ["DLU_HOME"] = tempfile.mkdtemp(prefix="dlu-bench-home-", dir="/tmp")
    from dlu_prime import ray_env, roles
    from dlu_prime.local import LocalJobClient

    # As `dlu run` starts its embedded Ray: the node's warm-up (the zygote importing torch) beside
    # it. Started here, outside the timed runs; the local client then uses this Ray.
    roles.warm_up_this_node(reference_job(0, "").roles)
    ray_env.init_local(num_cpus=4, _temp_dir=tempfile.mkdtemp(prefix="dlu-bench-", dir="/tmp"))
    client = LocalJobClient()
    simple: list[float] = []
    for run in range(runs):
        t_running, t_total = timed(client, simple_job(run), running)
        simple.append(t_running)
        print(
            f"simple run {run}: submit -> RUNNING {t_running:.2f} s, -> STOPPED {t_total:.2f} s", flush=True
        )
    reference: list[float] = []
    for run in range(runs):
        t_step, t_total = timed(
            client, reference_job(run, tempfile.mkdtemp(prefix="dlu-bench-ckpt-")), first_step
        )
        reference.append(t_step)
        print(
            f"reference run {run}: submit -> first training step {t_step:.2f} s, -> STOPPED {t_total:.2f} s",
            flush=True,
        )
    print(f"submit -> RUNNING, 4 simple workers (median of {runs}): {statistics.median(simple):.2f} s")
    print(
        f"submit -> first training step, reference job with node check (median of {runs}): "
        f"{statistics.median(reference):.2f} s (no budget of its own: DESIGN section 9 budgets `dlu run` "
        "start -> first step, job_e2e.py)"
    )
    figure(
        "submit_to_running_simple",
        statistics.median(simple),
        "s",
        label="submit -> RUNNING, 4 simple workers",
    )
    figure(
        "submit_to_first_step",
        statistics.median(reference),
        "s",
        label="submit -> first training step, reference job, node check on (Ray already up)",
    )


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 3)
