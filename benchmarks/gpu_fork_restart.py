"""GPU check below Ray: ranks forked from DLU's torch zygote use CUDA and NCCL, crash, and are
forked again from the same zygote (what an in-place restart does), then the node-check probe
runs on NCCL.

Needs one NVIDIA GPU (two ranks where two are visible), no Ray: it runs where `gpu_smoke.py`
cannot (one GPU, or a machine without Ray). Each rank runs `gpu_smoke_train.py` (NCCL all-reduce
per step, the last rank raising at step 3 of the first attempt). The run passes when:

- the first attempt's crashing rank exits non-zero and the second attempt exits 0 on NCCL;
- every rank of both attempts started with its CUDA_VISIBLE_DEVICES, DLU_DEVICE and LOCAL_RANK,
  saw one GPU, was no bad fork, and found CUDA uninitialised at its first line (the zygote
  never initialised CUDA, though it imported torch);
- ranks holding 60% of their GPU's memory, ended while training (`TrainingProcess.end`, what a
  restart does to the survivors: back once each is a zombie) and slow to exit on SIGTERM, are
  at once followed by ranks that hold 60% again: the ended ones' GPU memory was free when
  `end()` returned (a stop that did not wait fails here: the next rank runs out of memory).

Prints `SKIPPED: <why>` and exits 0 where no GPU is visible; PASSED or FAILED, then FIGURE lines:
the zygote's warm-up, re-fork -> CUDA ready in every rank (median of `--restarts`), and the
probe's matmul + all-reduce on NCCL. Usage: `uv run python benchmarks/gpu_fork_restart.py`.
"""

from __future__ import annotations

import argparse
import json
import shutil
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from figures import figure
from gpu_smoke import Gpu, visible_gpus

ROOT = Path(__file__).resolve().parents[1]
TRAIN = "benchmarks/gpu_smoke_train.py"
CRASH_AT, STEPS = 3, 6


def _port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _attempt(
    launcher: Any,
    gpus: list[Gpu],
    out: Path,
    attempt: int,
    crash: bool,
    steps: int = STEPS,
    hold: float = 0.0,
    linger: float = 0.0,
) -> list[Any]:
    from dlu_elastic.worker.process import ProcessSpec

    port, ranks = _port(), len(gpus)
    (out / str(attempt)).mkdir(parents=True, exist_ok=True)
    procs: list[Any] = []
    for rank, gpu in enumerate(gpus):
        env = {
            "RANK": str(rank),
            "LOCAL_RANK": str(rank),
            "WORLD_SIZE": str(ranks),
            "LOCAL_WORLD_SIZE": str(ranks),
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
            "TORCHELASTIC_RESTART_COUNT": str(0 if crash else attempt),
            "CUDA_VISIBLE_DEVICES": gpu.uuid or str(gpu.index),
        }
        crash_rank = ranks - 1 if crash else -1
        entry = (
            f"{TRAIN} --out {out / str(attempt)} --steps {steps} --crash-at-step {CRASH_AT} "
            f"--crash-rank {crash_rank} --step-seconds 0.05 --hold-fraction {hold} "
            f"--linger-on-term {linger}"
        )
        procs.append(launcher.start(ProcessSpec(entry, env=env, workdir=str(ROOT), device="cuda:0")))
    return procs


def _wait_for(paths: list[Path], timeout_s: float) -> float:
    began = time.perf_counter()
    while not all(p.exists() for p in paths):
        if time.perf_counter() - began > timeout_s:
            raise TimeoutError(
                f"not written within {timeout_s} s: {[str(p) for p in paths if not p.exists()]}"
            )
        time.sleep(0.002)
    return time.perf_counter() - began


HOLD = 0.6  # of each GPU's memory: two such ranks on one GPU cannot both hold it
LINGER_S = 2.0  # an ended rank exits this long after its SIGTERM, memory held: longer than a fork


def _end_while_holding_memory(launcher: Any, gpus: list[Gpu], out: Path, attempt: int) -> list[str]:
    """Ranks holding HOLD of their GPU are ended mid-training, and the next ranks, forked the
    moment `end()` returns, must hold HOLD again: no memory of the ended ones may be left."""
    procs = _attempt(launcher, gpus, out, attempt, crash=False, steps=1_000_000, hold=HOLD, linger=LINGER_S)
    _wait_for([out / str(attempt) / f"start-rank{r}-attempt{attempt}.json" for r in range(len(gpus))], 120)
    time.sleep(1.0)  # training: NCCL's communicator is up too
    for proc in procs:
        proc.end(5.0)
    attempt += 1
    procs = _attempt(launcher, gpus, out, attempt, crash=False, hold=HOLD)
    codes = [p.wait(180) for p in procs]
    if codes != [0] * len(gpus):
        return [f"after end(): exit codes {codes}: {[p.last_failure for p in procs]}"]
    print(f"end() while holding {HOLD:.0%} of each GPU: the next ranks held it again at once", flush=True)
    return []


def _check_start(record: dict[str, Any], gpu: Gpu) -> list[str]:
    problems: list[str] = []
    tag = f"rank {record['rank']} attempt {record['attempt']}"
    if record["bad_fork_at_start"] or record["cuda_initialized_at_start"]:
        problems.append(f"{tag}: forked with CUDA already initialised (bad fork)")
    if record["device_count"] != 1:
        problems.append(f"{tag}: saw {record['device_count']} GPUs, not its one")
    if gpu.uuid and record["gpu_uuid"].lower().removeprefix("gpu-") != gpu.uuid.lower().removeprefix("gpu-"):
        problems.append(f"{tag}: on GPU {record['gpu_uuid']}, not {gpu.uuid}")
    if record["env"].get("DLU_DEVICE") != "cuda:0" or record["env"].get("LOCAL_RANK") != str(record["rank"]):
        problems.append(f"{tag}: environment {record['env']}")
    return problems


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--restarts", type=int, default=3, help="re-forks to time (median printed)")
    args = parser.parse_args()
    gpus = visible_gpus()[:2]
    if not gpus:
        print("SKIPPED: no NVIDIA GPU visible (nvidia-smi -L, /proc/driver/nvidia/gpus)", flush=True)
        return 0
    from dlu_elastic.node_check import run_probe
    from dlu_elastic.worker.process import TrainingLauncher

    print(f"GPUs: {', '.join(f'{g.index} {g.name}' for g in gpus)}", flush=True)
    out = Path(tempfile.mkdtemp(prefix="dlu-gpu-fork-", dir="/tmp"))
    problems: list[str] = []
    launcher = TrainingLauncher()
    began = time.perf_counter()
    launcher.warm_up()
    warm_up_s = time.perf_counter() - began
    procs = _attempt(launcher, gpus, out, 0, crash=True)
    codes = [p.wait(180) for p in procs]
    if codes[-1] in (0, None):
        problems.append(f"the crashing rank exited {codes[-1]}, expected an error")
    refork_s: list[float] = []
    for attempt in range(1, args.restarts + 1):
        began = time.perf_counter()
        procs = _attempt(launcher, gpus, out, attempt, crash=False)
        starts = [out / str(attempt) / f"start-rank{r}-attempt{attempt}.json" for r in range(len(gpus))]
        _wait_for(starts, 120)
        refork_s.append(time.perf_counter() - began)
        codes = [p.wait(180) for p in procs]
        if codes != [0] * len(gpus):
            problems.append(f"attempt {attempt}: exit codes {codes}: {[p.last_failure for p in procs]}")
            break
        for rank, gpu in enumerate(gpus):
            problems += _check_start(json.loads(starts[rank].read_text()), gpu)
            done = json.loads((out / str(attempt) / f"done-rank{rank}-attempt{attempt}.json").read_text())
            if done["backend"] != "nccl" or len(done["sums"]) != STEPS:
                problems.append(f"attempt {attempt} rank {rank}: {done}")
    if not problems:
        problems += _end_while_holding_memory(launcher, gpus, out, args.restarts + 1)
    probe_s = run_probe(0, 1, "127.0.0.1", _port(), "nccl", 4096, 64, "cuda:0", 60.0)
    if problems:
        print("FAILED:\n  " + "\n  ".join(problems), flush=True)
        print(f"(files kept: {out})", flush=True)
        return 1
    shutil.rmtree(out, ignore_errors=True)
    print(
        f"PASSED: {len(gpus)} NCCL rank(s) forked from the zygote, a crash, {len(refork_s)} re-forks "
        "from the same zygote, each rank on its own GPU, no bad fork",
        flush=True,
    )
    figure("gpu_zygote_warm_up", warm_up_s, "s", label="GPU: torch zygote warm-up (preload)")
    figure(
        "gpu_refork_to_cuda_ready",
        statistics.median(refork_s),
        "s",
        label="GPU: re-fork from the zygote -> CUDA ready in every rank (median)",
    )
    figure(
        "gpu_node_check_probe_nccl",
        probe_s,
        "s",
        label="GPU: node-check probe, 4096 matmul + 64 MB all-reduce",
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
