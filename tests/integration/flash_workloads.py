"""Training functions for tests/integration/test_flash_checkpoint.py (run in training processes).

`train` trains a deterministic toy state for STEPS steps (an allreduce per step keeps the ranks
in lock step, as DDP does), saves it with dlu_elastic.checkpoint after every step and records,
per rank: each step's checksum (`sum-r{rank}-s{step}.txt`, written before its save, so a
process stopped right after a save leaves no restorable step unrecorded), a `saved-r{rank}-s{step}`
marker once the save returned, and per process start what load() returned. The test compares
the checksum of the restored state with the one recorded for that step.
Knobs (environment): OUT_DIR, STEPS, KILL_AFTER_SAVE ("step:rank": SIGKILL after that save,
first round only), SHARED=1 (a DDP job: every rank trains the same state, rank 0 saves it and
the others save None), OUT_DIR/finish (every rank stops after the step that sees it), and
dlu_elastic's DLU_FAULT_CHECKPOINT_KILL_MID_SAVE.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import time
from pathlib import Path
from typing import Any


def checksum(state: dict[str, Any]) -> str:
    digest = hashlib.sha256()
    for key in sorted(state["tensors"]):
        tensor = state["tensors"][key]
        digest.update(f"{key}:{tensor.dtype}:{list(tensor.shape)}".encode())
        digest.update(bytes(tensor.contiguous().view(-1).view(__import__("torch").uint8).tolist()))
    digest.update(json.dumps(state["meta"], sort_keys=True).encode())
    return digest.hexdigest()


def _fresh(rank: int) -> dict[str, Any]:
    import torch

    return {
        "tensors": {
            "w": torch.full((64, 32), float(rank), dtype=torch.float64),
            "h": torch.zeros(100, dtype=torch.bfloat16),
            "n": torch.zeros(7, dtype=torch.int32),
            "mask": torch.zeros(5, dtype=torch.bool),
        },
        "meta": {"rank": rank, "step": 0, "note": "flash"},
    }


def _advance(state: dict[str, Any], step: int) -> None:
    t = state["tensors"]
    t["w"].mul_(1.01).add_(step)
    t["h"].add_(1)
    t["n"] += step
    t["mask"][step % 5] = not bool(t["mask"][step % 5])
    state["meta"]["step"] = step


def train() -> None:
    import torch
    import torch.distributed as dist

    from dlu_elastic import checkpoint

    rank = dist.get_rank()
    out = Path(os.environ["OUT_DIR"])
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    steps = int(os.environ.get("STEPS", "12"))
    shared = os.environ.get("SHARED") == "1"
    restored = checkpoint.load(missing_ok=True)
    state = restored.state if restored is not None else _fresh(0 if shared else rank)
    start = restored.step if restored is not None else 0
    record = {
        "attempt": attempt,
        "step": start,
        "source": restored.source if restored is not None else None,
        "checksum": checksum(state) if restored is not None else None,
    }
    if shared:
        record["world"] = dist.get_world_size()
    with open(out / f"starts-r{rank}.jsonl", "a") as starts:  # one line per process start
        starts.write(json.dumps(record) + "\n")
    kill = os.environ.get("KILL_AFTER_SAVE")
    kill_step, kill_rank = (int(x) for x in kill.split(":")) if kill else (-1, -1)
    for step in range(start + 1, steps + 1):
        _advance(state, step)
        lockstep = torch.ones(1)
        lockstep[0] = float((out / "finish").exists())
        dist.all_reduce(lockstep)
        # Recorded before the save: a process stopped between a committed save and its record
        # (a resize ends the old world at any point) would leave a restorable step unrecorded.
        sums = out / f"sum-r{rank}-s{step}.txt"
        if not sums.exists():  # atomic: a SIGKILL between the open and the write leaves no empty record
            partial = sums.with_name(f".{sums.name}.{os.getpid()}")
            partial.write_text(checksum(state))
            partial.replace(sums)
        checkpoint.save(step, None if shared and rank != 0 else state)
        (out / f"saved-r{rank}-s{step}").touch()  # what a test waits on before a fault after a save
        if attempt == 0 and (step, rank) == (kill_step, kill_rank):
            os.kill(os.getpid(), signal.SIGKILL)
        if lockstep[0] > 0:
            break
        time.sleep(float(os.environ.get("STEP_SLEEP_S", "0")))
    (out / f"done-r{rank}.json").write_text(
        json.dumps({"step": state["meta"]["step"], "checksum": checksum(state)})
    )
