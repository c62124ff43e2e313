"""The roles of the memory relaunch integration tests. `hog`: its first incarnation holds more
than 90% of its role's `resources.memory` until it is replaced; the next one (relaunched with
more) holds the same, which is no pressure on its new limit, and finishes. `elastic_hog`: the
same for one rank of an elastic role, in its training process."""

from __future__ import annotations

import os
import time
from pathlib import Path

from dlu_prime.runtime.context import current_worker, heartbeat

PAGE = 4096


def hog() -> None:
    marker = Path(os.environ["MEMORY_MARKER"])
    first = not marker.exists()
    marker.write_text("relaunched" if not first else "started")
    held = bytearray(int(os.environ["MEMORY_HOLD_MB"]) * 2**20)
    for at in range(0, len(held), PAGE):  # resident, not only reserved
        held[at] = 1
    deadline = time.monotonic() + (150.0 if first else 6.0)
    step = 0
    while time.monotonic() < deadline:
        step += 1
        heartbeat(step)
        time.sleep(0.5)
    if first:
        raise SystemExit(f"not relaunched with more memory while holding {len(held) >> 20} MiB")


def shared_hog() -> None:
    """A role of several actors sharing its placement group: rank MEMORY_HOG_RANK's first
    incarnation holds MEMORY_HOLD_MB until it is replaced; every other incarnation (the other
    ranks, a rank a growth adds, the relaunched one) holds nothing and runs until the test
    writes MEMORY_DONE, then finishes."""
    rank = current_worker().rank
    marker = Path(os.environ["MEMORY_MARKER"])
    done = Path(os.environ["MEMORY_DONE"])
    hog = rank == int(os.environ["MEMORY_HOG_RANK"]) and not marker.exists()
    if hog:
        marker.write_text("started")
    held = bytearray(int(os.environ["MEMORY_HOLD_MB"]) * 2**20 if hog else 0)
    for at in range(0, len(held), PAGE):
        held[at] = 1
    deadline = time.monotonic() + 150.0
    step = 0
    while time.monotonic() < deadline and not done.exists():
        step += 1
        heartbeat(step)
        time.sleep(0.5)
    if not done.exists():
        raise SystemExit(f"rank {rank}: the test never said it was done")


def elastic_hog() -> None:
    """An elastic rank's training (the launcher set up its gloo group): MEMORY_STEPS steps of
    one allreduce and a heartbeat each, resumed from the step rank 0 saves. The first process of
    rank MEMORY_HOG_RANK, once the test has written how many MiB to add (`hold-mb`: what takes
    its agent and itself, as the agent measures them, past 90% of its limit), holds that until
    its actor is relaunched; a process of the relaunched actor holds nothing. Each process
    writes its pid and the steps it ran to MEMORY_DIR."""
    import json

    import torch
    import torch.distributed as dist

    out = Path(os.environ["MEMORY_DIR"])
    rank, steps = dist.get_rank(), int(os.environ["MEMORY_STEPS"])
    saved, asked = out / "step", out / "hold-mb"
    start = int(saved.read_text()) if saved.exists() else 0
    marker = out / f"hogged-{rank}"
    hog = rank == int(os.environ["MEMORY_HOG_RANK"]) and not marker.exists()
    if hog:
        marker.write_text(str(os.getpid()))
    held = bytearray(0)
    run = out / f"run-{rank}-{os.getpid()}.json"
    began = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])  # tells a reused pid apart
    record = {"rank": rank, "pid": os.getpid(), "began": began, "start": start, "held_mb": 0, "end": start}
    run.write_text(json.dumps(record))
    pause = float(os.environ["MEMORY_STEP_S"])
    for step in range(start + 1, steps + 1):
        if hog and not held and asked.exists():
            held = bytearray(int(asked.read_text()) * 2**20)
            for at in range(0, len(held), PAGE):  # resident, not only reserved
                held[at] = 1
            record["held_mb"] = len(held) >> 20
        value = torch.tensor([1.0])
        dist.all_reduce(value)
        if rank == 0:
            (out / "step.tmp").write_text(str(step))
            (out / "step.tmp").replace(saved)
        heartbeat(step)
        run.write_text(json.dumps({**record, "end": step}))
        time.sleep(pause)
    if hog:
        raise SystemExit(f"not relaunched with more memory while holding {len(held) >> 20} MiB")
