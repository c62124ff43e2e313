"""In-place restart: a warm launcher forks 4 training processes that finish gloo init + allreduce.

Compared with what the restart would cost without it: a fresh interpreter's `import torch`
(an actor restart costs that plus Ray's own start). The in-place figure is start() of the first
rank to the last rank's "allreduce done" heartbeat (timestamped in the child). Prints one line
per run, the in-place median, then its FIGURE lines (benchmarks/figures.py).
Usage: `uv run python benchmarks/inplace_restart.py [runs]`.
"""

from __future__ import annotations

import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

from figures import figure

from dlu_elastic.worker.process import ProcessEventKind, ProcessSpec, TrainingLauncher

HERE = Path(__file__).resolve().parent
RANKS = 4


def allreduce_once() -> None:
    """The training entrypoint (the launcher has set up the gloo group)."""
    import torch
    import torch.distributed as dist

    from dlu_prime.runtime import heartbeat

    value = torch.ones(1)
    dist.all_reduce(value)
    assert value.item() == dist.get_world_size()
    heartbeat(1, value.item())


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _env(rank: int, port: int) -> dict[str, str]:
    return {
        "RANK": str(rank),
        "LOCAL_RANK": str(rank),
        "WORLD_SIZE": str(RANKS),
        "LOCAL_WORLD_SIZE": str(RANKS),
        "GROUP_RANK": "0",
        "NODE_RANK": "0",
        "ROLE_RANK": str(rank),
        "ROLE_WORLD_SIZE": str(RANKS),
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
        "TORCHELASTIC_RESTART_COUNT": "0",
        "TORCHELASTIC_MAX_RESTARTS": "3",
        "TORCHELASTIC_RUN_ID": "bench",
    }


def in_place_round(launcher: TrainingLauncher) -> tuple[float, float]:
    """(start -> last allreduce done, start -> all exited) in seconds."""
    port = _free_port()
    t0 = time.time()
    procs = [
        launcher.start(
            ProcessSpec(f"{Path(__file__).stem}:allreduce_once", env=_env(r, port), workdir=str(HERE))
        )
        for r in range(RANKS)
    ]
    codes = [p.wait(60) for p in procs]
    exited = time.time() - t0
    if codes != [0] * RANKS:
        raise SystemExit(f"training processes failed: {codes}\n{[p.last_failure for p in procs]}")
    done = [e.time for p in procs for e in p.events() if e.kind is ProcessEventKind.HEARTBEAT]
    return max(done) - t0, exited


def cold_import_torch() -> float:
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-c", "import torch"], check=True, capture_output=True)
    return time.perf_counter() - t0


def main(runs: int = 5) -> None:
    cold = [cold_import_torch() for _ in range(3)]
    for i, value in enumerate(cold):
        print(f"cold `python -c 'import torch'` run {i}: {value:.3f} s", flush=True)
    print(f"cold `python -c 'import torch'`: {statistics.median(cold):.3f} s (median of {len(cold)})")

    launcher = TrainingLauncher()
    warm = launcher.warm_up()
    print(f"launcher warm-up (forkserver imports torch once): {warm:.3f} s, preloaded: {launcher.preloaded}")
    in_place_round(launcher)  # not counted: the first use of gloo and the page cache
    done: list[float] = []
    for i in range(runs):
        ready, exited = in_place_round(launcher)
        done.append(ready)
        print(
            f"in-place run {i}: {RANKS} ranks gloo init + allreduce done {ready:.3f} s, all exited {exited:.3f} s"
        )
    launcher.shutdown()
    print(
        f"in-place restart, {RANKS} training processes from a warm launcher to gloo init + allreduce done: "
        f"{statistics.median(done):.3f} s (median of {runs})"
    )
    figure(
        "cold_import_torch", statistics.median(cold), "s", label="cold `import torch` (what in-place saves)"
    )
    figure(
        "inplace_launch_ready",
        statistics.median(done),
        "s",
        label=f"in-place: {RANKS} ranks forked, gloo init + allreduce (part of the 0.25 s in-place tier)",
    )


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 5)
