"""The embedded Ray's start, as `dlu run` does it (`ray_env.init_local`, then one actor call),
with DLU's stand-in for Ray's minimal dashboard agent and without it (`DLU_RAY_AGENT_STUB=0`),
interleaved: on a shared machine only interleaved runs compare.

Each run is a fresh process with its own Ray temp dir. It prints the wall time to Ray up and to
the first actor's answer, the driver's CPU, and the CPU every process of that Ray had used by
then, by kind (read from /proc: the figure that the machine's load does not move). Prints one
line per run, the medians, then FIGURE lines (benchmarks/figures.py).
Usage: `uv run python benchmarks/ray_boot.py [pairs]` (default 4).
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile

from figures import compile_workspace, figure

CHILD = r"""
import json, os, sys, time
t0 = time.monotonic()
from dlu_prime import ray_env  # first: it sets what Ray reads when imported
import ray
ray_env.init_local(log_to_driver=False, logging_level=40)
up = time.monotonic() - t0

@ray.remote(num_cpus=0)
class Echo:
    def pid(self):
        return os.getpid()

ray.get(Echo.remote().pid.remote(), timeout=300)
actor = time.monotonic() - t0
tick = os.sysconf("SC_CLK_TCK")

def tree(pid):
    found = [pid]
    try:
        for child in open(f"/proc/{pid}/task/{pid}/children").read().split():
            found += tree(int(child))
    except OSError:
        pass
    return found

cpu = {}
for pid in tree(os.getpid())[1:]:
    try:
        fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
        command = open(f"/proc/{pid}/cmdline").read().replace("\0", " ")
    except OSError:
        continue
    kind = ("agent stub" if "ray_agent_stub" in command else "dashboard agent" if "dashboard/agent.py" in command
            else "runtime-env agent" if "runtime_env/agent" in command else os.path.basename(command.split()[0]))
    cpu[kind] = cpu.get(kind, 0.0) + (int(fields[11]) + int(fields[12])) / tick
print("RESULT " + json.dumps({"up": up, "actor": actor, "driver_cpu": time.process_time(), "cpu": cpu}), flush=True)
os._exit(0)
"""


def one(stub: bool) -> dict[str, object]:
    env = {**os.environ, "RAY_TMPDIR": tempfile.mkdtemp(prefix="dlu-boot-", dir="/tmp")}
    env["DLU_RAY_AGENT_STUB"] = "1" if stub else "0"
    done = subprocess.run([sys.executable, "-c", CHILD], env=env, capture_output=True, text=True, timeout=300)
    for line in done.stdout.splitlines():
        if line.startswith("RESULT "):
            found: dict[str, object] = json.loads(line.removeprefix("RESULT "))
            return found
    raise RuntimeError(f"no result (exit {done.returncode}):\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}")


def main() -> None:
    pairs = int(sys.argv[1]) if len(sys.argv) > 1 else 4
    compile_workspace()
    runs: dict[bool, list[dict[str, object]]] = {True: [], False: []}
    for _ in range(pairs):
        for stub in (True, False):
            load = os.getloadavg()[0]
            found = one(stub)
            cpu: dict[str, float] = found["cpu"]  # type: ignore[assignment]
            found["ray_cpu"] = sum(cpu.values())
            runs[stub].append(found)
            print(
                f"stub {'on ' if stub else 'off'} load {load:5.1f}: Ray up {found['up']:.2f} s, actor {found['actor']:.2f} s, "
                f"driver CPU {found['driver_cpu']:.2f} s, Ray processes' CPU {found['ray_cpu']:.2f} s "
                + ", ".join(f"{k} {v:.2f}" for k, v in sorted(cpu.items())),
                flush=True,
            )
    for stub in (True, False):
        got = runs[stub]

        def median(key: str, got: list[dict[str, object]] = got) -> float:
            return statistics.median(float(r[key]) for r in got)  # type: ignore[arg-type]

        print(
            f"median, stub {'on ' if stub else 'off'}: Ray up {median('up'):.2f} s, actor {median('actor'):.2f} s, "
            f"Ray processes' CPU {median('ray_cpu'):.2f} s"
        )
    on = runs[True]
    figure("ray_boot_actor_s", statistics.median(float(r["actor"]) for r in on), "s",  # type: ignore[arg-type]
           label="embedded Ray start -> first actor answers")  # fmt: skip
    figure("ray_boot_cpu_s", statistics.median(float(r["ray_cpu"]) for r in on), "s",  # type: ignore[arg-type]
           label="CPU of the embedded Ray's processes up to the first actor's answer")  # fmt: skip


if __name__ == "__main__":
    main()
