"""Submit -> RUNNING (and -> first heartbeat, -> STOPPED) for a job of four simple workers.

The embedded Ray is started first and not counted: the figure is DLU's own cost. Prints one
line per run and the median last. Usage: `uv run python benchmarks/submit_latency.py [runs]`.
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from pathlib import Path

from dlu_api.spec import spec_from_dict
from dlu_api.status import JobStage

ROOT = Path(__file__).resolve().parents[1]


def main(runs: int = 5) -> None:
    from dlu_prime import launcher, ray_env

    ray_env.init_local(num_cpus=4, _temp_dir=tempfile.mkdtemp(prefix="dlu-bench-", dir="/tmp"))
    to_running: list[float] = []
    for run in range(runs):
        spec = spec_from_dict(
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
        t0 = time.perf_counter()
        launcher.submit_job(spec, str(ROOT))
        running_at: float | None = None

        def seen(status: object, t0: float = t0) -> None:
            nonlocal running_at
            stage = getattr(status, "stage", None)
            if running_at is None and stage in (JobStage.RUNNING, JobStage.STOPPING, JobStage.STOPPED):
                running_at = time.perf_counter() - t0

        final = launcher.wait_job(spec, seen, poll_interval_s=0.02)
        total = time.perf_counter() - t0
        assert final.exit_code == 0, final.reason
        assert running_at is not None
        to_running.append(running_at)
        print(f"run {run}: submit -> RUNNING {running_at:.2f} s, submit -> STOPPED {total:.2f} s", flush=True)
    print(f"submit -> RUNNING (4 simple workers, median of {runs}): {statistics.median(to_running):.2f} s")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 5)
