"""Entrypoints that tests/integration/test_training_process.py runs in forked training processes.

Imported by module name with this directory as the working directory. Results go to files in
the directory named by the OUT_DIR environment variable.
"""

from __future__ import annotations

import gc
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from dlu_prime.runtime import current_worker, heartbeat, report_error


def _out(name: str) -> Path:
    return Path(os.environ["OUT_DIR"]) / name


def _write(name: str, data: dict[str, Any]) -> None:
    tmp = _out(name + ".tmp")
    tmp.write_text(json.dumps(data))
    tmp.replace(_out(name))


def allreduce_sum() -> None:
    """The process group is set up by the launcher: allreduce rank+1 and record what is seen."""
    import torch
    import torch.distributed as dist

    value = torch.tensor([float(dist.get_rank() + 1)])
    dist.all_reduce(value)
    heartbeat(1, float(value.item()))  # its timestamp marks "init + allreduce done"
    worker = current_worker()
    _write(
        f"allreduce-{dist.get_rank()}.json",
        {
            "sum": value.item(),
            "rank": dist.get_rank(),
            "world_size": dist.get_world_size(),
            "backend": dist.get_backend(),
            "env": {k: v for k, v in os.environ.items() if k.isupper()},
            "cwd": os.getcwd(),
            "worker": {
                "job": worker.job,
                "role": worker.role,
                "rank": worker.rank,
                "world_size": worker.world_size,
                "local_rank": worker.local_rank,
                "local_world_size": worker.local_world_size,
                "node_rank": worker.node_rank,
                "actor_name": worker.actor_name,
                "config": worker.config,
                "device": worker.device,
            },
        },
    )


def allreduce_only() -> None:
    """The smallest training step for the restart timing: allreduce and say when it is done."""
    import torch
    import torch.distributed as dist

    value = torch.ones(1)
    dist.all_reduce(value)
    heartbeat(1, float(value.item()))


def allreduce_then_hang() -> None:
    """Join the process group, allreduce once, say so in ready-RANK.json, then run forever (the
    loopback test reads what every process listens on meanwhile)."""
    import torch
    import torch.distributed as dist

    value = torch.ones(1)
    dist.all_reduce(value)
    heartbeat(1, float(value.item()))
    _write(f"ready-{dist.get_rank()}.json", {"pid": os.getpid(), "sum": value.item()})
    while True:
        time.sleep(0.05)


def raise_error() -> None:
    raise RuntimeError("boom from elastic_workloads")


def raise_then_linger_at_exit() -> None:
    """Fail, then spend a long time in an exit hook (a slow teardown): the failure is known first."""
    import atexit

    atexit.register(time.sleep, 60.0)
    raise RuntimeError("boom before a slow teardown")


def exit_with_code() -> None:
    raise SystemExit(int(os.environ.get("EXIT_CODE", "3")))


def _barrier() -> None:
    """Every rank got here: none leaves while a peer still sets the process group up (seen: a
    rank that returned at once closed the mesh on its peer, "Connection closed by peer")."""
    import torch.distributed as dist

    if dist.is_initialized():
        dist.barrier()


def finish_or_fail_on_first_attempt() -> None:
    """First attempt: rank 0 returns (it finished) and rank 1 exits 3; FAIL_FIRST=1 makes rank 1
    exit as soon as rank 0's first attempt runs and rank 0 return once rank 1 exits (it finishes
    during the restart), otherwise rank 0 returns at once and rank 1 exits after FAIL_DELAY_S.
    Every later attempt succeeds. Each run leaves ran-RANK-ATTEMPT.json.

    With FAIL_FIRST rank 1 waits for rank 0's ran-0-0.json: its exit halts the round, and its
    agent's halt SIGTERMs rank 0's process; one that had not reached its first line yet (slow
    to leave the process group's init on a loaded machine) never wrote its file (seen 1 in 3)."""
    rank = int(os.environ["RANK"])
    attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
    _write(f"ran-{rank}-{attempt}.json", {"pid": os.getpid(), "world_size": os.environ["WORLD_SIZE"]})
    if attempt > 0:
        _barrier()  # a rank that exits at once can close gloo's mesh on a peer still connecting
        return
    fail_first = os.environ.get("FAIL_FIRST") == "1"
    deadline = time.monotonic() + 30
    if rank == 1:
        if fail_first:
            while not _out("ran-0-0.json").exists() and time.monotonic() < deadline:
                time.sleep(0.005)
        else:
            time.sleep(float(os.environ.get("FAIL_DELAY_S", "1.0")))
        _write("failing-1-0.json", {"pid": os.getpid()})
        raise SystemExit(3)
    if fail_first:  # return as the peer fails: its restart is under way
        while not _out("failing-1-0.json").exists() and time.monotonic() < deadline:
            time.sleep(0.005)


def finish_while_peer_trains_on_first_attempt() -> None:
    """First attempt: rank 0 returns at once, rank 1 trains on (sleeps) until it is stopped,
    exiting 3 after 60 s if nobody stopped it. Every later attempt succeeds. Each run leaves
    ran-RANK-ATTEMPT.json."""
    rank = int(os.environ["RANK"])
    attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
    _write(f"ran-{rank}-{attempt}.json", {"pid": os.getpid(), "world_size": os.environ["WORLD_SIZE"]})
    if attempt > 0 or rank == 0:
        return
    time.sleep(60)
    raise SystemExit(3)


def beat_then_fail_on_first_attempt() -> None:
    """Every attempt beats a step, leaving ran-RANK-ATTEMPT.json (its MASTER_PORT: the round's
    store); on the first, rank 1 then exits 3 and rank 0 waits to be stopped. Later attempts
    beat on until OUT_DIR/go exists, then return."""
    from dlu_prime.runtime import heartbeat

    rank = int(os.environ["RANK"])
    attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
    heartbeat(attempt + 1)
    _write(f"ran-{rank}-{attempt}.json", {"pid": os.getpid(), "master_port": int(os.environ["MASTER_PORT"])})
    if attempt == 0:
        if rank == 1:
            time.sleep(0.5)
            raise SystemExit(3)
        time.sleep(60)
        raise SystemExit(4)
    deadline = time.monotonic() + 60
    while not _out("go").exists() and time.monotonic() < deadline:
        heartbeat(attempt + 1)
        time.sleep(0.05)


def heartbeats() -> None:
    steps = int(os.environ.get("STEPS", "50"))
    for step in range(1, steps + 1):
        heartbeat(step, step * 0.5)
    report_error("loss is NaN at the last step (test report)")


def hang() -> None:
    """Run forever, with a subprocess of its own (as DataLoader workers would be)."""
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    _write("hang.json", {"pid": os.getpid(), "child": child.pid})
    heartbeat(0)
    while True:
        time.sleep(0.05)


def hang_ignoring_sigterm() -> None:
    """Run forever, shrugging off SIGTERM; with OUT_DIR set, write sigterm.json after each one
    survived (proof that it still runs after the signal)."""
    received: list[int] = []
    signal.signal(signal.SIGTERM, lambda signum, _frame: received.append(signum))
    heartbeat(0)
    noted = 0
    while True:
        if len(received) > noted and "OUT_DIR" in os.environ:
            noted = len(received)
            _write("sigterm.json", {"pid": os.getpid(), "survived": noted})
        time.sleep(0.05)


def describe_process() -> None:
    """Where this process came from and what it inherited (tests of the zygote)."""
    print(f"stdout of pid {os.getpid()}", flush=True)
    _write(
        f"process-{os.getpid()}.json",
        {
            "pid": os.getpid(),
            "ppid": os.getppid(),
            "pgid": os.getpgid(0),
            "marker": os.environ.get("DLU_TEST_MARKER"),
            "sys_path_has_extra": os.environ.get("DLU_TEST_EXTRA_PATH", "") in sys.path,
            "torch_preloaded": "torch" in sys.modules,
            "frozen_objects": gc.get_freeze_count(),
            "gc_enabled": gc.isenabled(),
            "tempdir": tempfile.gettempdir(),
        },
    )


if __name__ == "__main__":  # run as `-m elastic_workloads args...`
    _write(
        "module-argv.json",
        {"argv": sys.argv, "name": __name__, "rank": os.environ.get("RANK"), "cwd": os.getcwd()},
    )


def finish_when_told() -> None:
    """Join the process group, say so in ready-RANK.json, then return once OUT_DIR/go exists:
    a job that ends well once the test has seen what runs."""
    import torch
    import torch.distributed as dist

    value = torch.ones(1)
    dist.all_reduce(value)
    heartbeat(1, float(value.item()))
    _write(f"ready-{dist.get_rank()}.json", {"pid": os.getpid()})
    while not _out("go").exists():
        time.sleep(0.05)
    dist.barrier()


def record_run() -> None:
    """Append this process's pid to OUT_DIR/runs-RANK.txt and return: one line per run, so a
    rank that ran again shows two."""
    with open(_out(f"runs-{os.environ['RANK']}.txt"), "a", encoding="utf-8") as out:
        out.write(f"{os.getpid()}\n")
