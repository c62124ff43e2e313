"""Run in a fresh interpreter by test_ray_workers.py: an embedded Ray (ray_env.init_local) and
the faults the test names; prints one JSON line of what it saw."""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

import ray

from dlu_prime import ray_env, zygote
from dlu_prime.ray_workers import ENTRY_ENV


@ray.remote(max_restarts=1, max_task_retries=-1)
class Probe:
    def identity(self) -> dict[str, Any]:
        return {
            "pid": os.getpid(),
            "ppid": os.getppid(),
            "entry": os.environ.get(ENTRY_ENV),
            "retry": {name: os.environ.get(name) for name in ray_env.FAST_CONNECT_RETRY},
        }

    def add(self, a: int, b: int) -> int:
        return a + b


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split(") ")[1][0] != "Z"
    except OSError:
        return False


def wait_gone(pid: int, timeout_s: float = 20.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not alive(pid):
            return True
        time.sleep(0.05)
    return False


def zygote_pids(directory: Path) -> set[int]:
    found: set[int] = set()
    for path in directory.glob("z-*.sock"):
        try:
            found.add(int(zygote.request(path, {"op": "ping"}, 5.0)["pid"]))
        except (zygote.ZygoteError, KeyError, ValueError):
            continue
    return found


def main(fault: str) -> None:
    ray_env.init_local(num_cpus=2)
    zygotes = Path(os.environ[zygote.DIR_ENV])
    seen: dict[str, Any] = {}
    # A new Ray starts a worker per CPU before any job, from Ray's own script; the third actor
    # gets a worker started for this job.
    probes = [Probe.remote() for _ in range(3)]  # type: ignore[attr-defined]
    identities = ray.get([p.identity.remote() for p in probes], timeout=60)
    index = next((i for i, ident in enumerate(identities) if ident["entry"]), 0)
    probe, first = probes[index], identities[index]
    seen["first"] = first
    seen["forked"] = first["entry"] is not None and first["ppid"] in zygote_pids(zygotes)
    if not seen["forked"] and fault != "kill_worker":
        raise SystemExit(f"no actor of the job runs in a forked worker: {identities}")
    if fault == "kill_worker":  # the worker process itself: Ray rebuilds the actor
        os.kill(first["pid"], signal.SIGKILL)
        seen["entry_gone"] = wait_gone(int(first["entry"])) if first["entry"] else None
    elif fault == "kill_entry":  # what the raylet started: the worker must not outlive it
        os.kill(int(first["entry"]), signal.SIGKILL)
        seen["worker_gone"] = wait_gone(first["pid"])
    elif fault == "kill_zygote":  # running workers keep running; new ones still start
        for pid in zygote_pids(zygotes):
            os.kill(pid, signal.SIGKILL)
        time.sleep(0.5)
        seen["still_answers"] = ray.get(probe.add.remote(2, 3), timeout=60) == 5
        other = Probe.remote()  # type: ignore[attr-defined]
        seen["new_actor"] = ray.get(other.add.remote(4, 5), timeout=60) == 9
        ray.kill(probe, no_restart=True)
        seen["worker_gone"] = wait_gone(first["pid"])
        seen["entry_gone"] = wait_gone(int(first["entry"]))
    if fault != "kill_zygote":  # the actor was rebuilt after its process died
        seen["answers"] = ray.get(probe.add.remote(1, 2), timeout=60) == 3
        seen["restarted"] = ray.get(probe.identity.remote(), timeout=60)["pid"] != first["pid"]
    ray.shutdown()
    print(json.dumps(seen), flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
