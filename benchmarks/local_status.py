"""`dlu status` of a local job, timed as a user runs it: a new `dlu` process each time.

A local status reads the job's files and imports no Ray (dlu_prime.local_records); budget
0.3 s p50 on a machine at load 2. Starts a small job with `dlu run --no-wait` (its own DLU_HOME
and Ray temp dir, not counted), times `dlu status JOB` N times, stops the job with `dlu stop`,
then prints p50 and p90 and the load average. Usage:
`uv run python benchmarks/local_status.py [N]` (default 20).
"""

from __future__ import annotations

import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from figures import compile_workspace, figure

BUDGET_S = 0.3
JOB = "bench-status"
DLU = str(Path(sys.executable).parent / "dlu")
WORKER = """
import time
from dlu_prime.runtime import heartbeat

def main() -> None:
    step = 0
    while True:
        time.sleep(0.2)
        step += 1
        heartbeat(step)
"""
SPEC = f"""
name: {JOB}
device_type: CPU
device_per_node: 0
roles:
  - name: worker
    entrypoint: bench_status_worker:main
    total: 1
    resources: {{cpu: 0.1}}
"""


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def _timed(args: list[str], cwd: Path, env: dict[str, str]) -> tuple[float, float, str]:
    """Wall seconds, CPU seconds (the child's user + system) and output of one command."""
    t0 = time.perf_counter()
    with tempfile.TemporaryFile() as out:
        proc = subprocess.Popen(args, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - t0
        proc.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        text = out.read().decode(errors="replace")
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(args)} failed ({proc.returncode}):\n{text}")
    return wall, usage.ru_utime + usage.ru_stime, text


def main(n: int) -> None:
    compile_workspace()
    work = Path(tempfile.mkdtemp(prefix="dlu-bst-", dir="/tmp"))
    (work / "bench_status_worker.py").write_text(WORKER)
    (work / "job.yaml").write_text(SPEC)
    env = {**os.environ, "DLU_HOME": str(work / "home"), "RAY_TMPDIR": str(work / "ray")}
    try:
        started = subprocess.run(
            [DLU, "run", "--no-wait", "job.yaml"],
            cwd=work,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        if started.returncode != 0:
            raise SystemExit(f"the job did not start:\n{started.stdout}{started.stderr}")
        times: list[float] = []
        cpu: list[float] = []
        for _ in range(n):
            wall, used, out = _timed([DLU, "status", JOB], work, env)
            times.append(wall)
            cpu.append(used)
            if "RUNNING" not in out:
                raise SystemExit(f"dlu status failed:\n{out}")
        print(f"dlu status of a running local job, {n} runs, wall s: " + " ".join(f"{t:.3f}" for t in times))
        print("  CPU s (user + system; what it costs on an idle core): " + " ".join(f"{t:.3f}" for t in cpu))
    finally:
        subprocess.run([DLU, "stop", JOB], cwd=work, env=env, capture_output=True, text=True, timeout=120)
        shutil.rmtree(work, ignore_errors=True)
    print(f"load average (1 min): {os.getloadavg()[0]:.2f}")
    figure("local_status_p50_s", statistics.median(times), "s", BUDGET_S, "dlu status (local job) p50")
    figure("local_status_p90_s", percentile(times, 0.9), "s", None, "dlu status (local job) p90")
    figure("local_status_cpu_p50_s", statistics.median(cpu), "s", None, "dlu status (local job) CPU p50")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 20)
