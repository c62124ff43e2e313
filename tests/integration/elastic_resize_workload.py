"""The training function of tests/integration/test_elastic_resize.py and
benchmarks/elastic_resize.py: steps of an allreduce whose sum must equal the world size.

Rank 0 keeps the step in a checkpoint file and appends "step world restart pid" per step to
steps.log in OUT_DIR, so the test sees which world each step ran at and that training resumed
from the checkpoint after every resize. Training ends, on every rank at the same step, once the
file OUT_DIR/finish exists (an allreduce of the flag), or after STEPS steps.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from dlu_prime.runtime import heartbeat


def train() -> None:
    import torch
    import torch.distributed as dist

    out = Path(os.environ["OUT_DIR"])
    checkpoint = out / "step.txt"
    step = int(checkpoint.read_text()) if checkpoint.exists() else 0
    steps = int(os.environ.get("STEPS", "100000"))
    pause = float(os.environ.get("STEP_S", "0.1"))
    world, rank = dist.get_world_size(), dist.get_rank()
    restart = os.environ.get("TORCHELASTIC_RESTART_COUNT", "?")
    while step < steps:
        value = torch.tensor([1.0, 1.0 if (out / "finish").exists() else 0.0])
        dist.all_reduce(value)
        if int(value[0].item()) != world:
            raise RuntimeError(f"allreduce summed {value[0].item()} over a world of {world}")
        step += 1
        if rank == 0:
            tmp = out / "step.tmp"
            tmp.write_text(str(step))
            tmp.replace(checkpoint)
            with (out / "steps.log").open("a") as log:
                log.write(f"{step} {world} {restart} {os.getpid()} {time.time():.3f}\n")
        heartbeat(step)
        if value[1].item() > 0:
            return
        time.sleep(pause)
