"""One rank of a real gloo world on localhost for test_flash_broadcast_unit.py (no Ray).

`python flash_ranks.py FOLDER OUT` saves steps 1..3 of a DDP-shaped state (rank 0 its state,
the other ranks None, as train_lm.py does), then loads the newest committed step through a new
view of the slots (what a restarted process has) and writes to OUT what it got: the step, the
source, each tensor's bytes (hex) and how many broadcasts and gathers (TCPStore round trips of
every rank) the restore made. RANK, WORLD_SIZE,
MASTER_ADDR and MASTER_PORT (the saves' group) and LOAD_PORT (the load's) come from the
environment.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist


def state(step: int) -> dict[str, Any]:
    """Many tensors of every kind (the reference job's AdamW state has 113)."""
    gen = torch.Generator().manual_seed(step)
    layers = {f"layer{i}.weight": torch.randn(4 + i, 3, generator=gen) for i in range(12)}
    return {
        "model": {
            **layers,
            "t": torch.arange(6, dtype=torch.float64).reshape(2, 3).t() * step,  # not contiguous
            "half": torch.full((5,), float(step), dtype=torch.bfloat16),
            "nan": torch.tensor([float("nan"), -0.0, float("inf")]),
        },
        "opt": {
            "state": {
                i: {"step": torch.tensor(float(step)), "exp_avg": torch.randn(7, generator=gen)}
                for i in range(8)
            },
            "param_groups": [{"lr": 0.1, "params": list(range(8))}],
        },
        "ids": torch.tensor([step, -step], dtype=torch.int64),
        "mask": torch.tensor([True, step % 2 == 0]),
        "empty": torch.empty(0, 3),
        "meta": {"step": step, "names": ["a", "b"], "pair": (1, 2)},
    }


def tensor_bytes(value: Any, path: str = "") -> dict[str, str]:
    """Every tensor's dtype, shape and raw bytes, by its path in the state."""
    if isinstance(value, torch.Tensor):
        raw = value.contiguous().reshape(-1).view(torch.uint8)
        return {path: f"{value.dtype}{list(value.shape)}:{bytes(raw.tolist()).hex()}"}
    found: dict[str, str] = {}
    items = (
        value.items()
        if isinstance(value, dict)
        else enumerate(value)
        if isinstance(value, list | tuple)
        else []
    )
    for key, item in items:
        found.update(tensor_bytes(item, f"{path}/{key}"))
    if not isinstance(value, dict | list | tuple | torch.Tensor):
        found[path] = repr(value)
    return found


def main() -> None:
    from dlu_elastic.checkpoint import FlashCheckpointer

    folder, out = Path(sys.argv[1]), Path(sys.argv[2])
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    saver = FlashCheckpointer(folder)
    for step in (1, 2, 3):
        saver.save(step, state(step) if rank == 0 else None)
        dist.barrier()
    saver.close()
    dist.barrier()
    dist.destroy_process_group()  # a restart's new round: a new store (the gathers' keys start over)
    port = int(os.environ["LOAD_PORT"])
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=int(os.environ["WORLD_SIZE"])
    )
    calls = {"broadcasts": 0, "gathers": 0}
    real_broadcast, real_gather = dist.broadcast, FlashCheckpointer._gather  # pyright: ignore[reportPrivateUsage]

    def broadcast(*args: Any, **kwargs: Any) -> Any:
        calls["broadcasts"] += 1
        return real_broadcast(*args, **kwargs)

    def gather(self: FlashCheckpointer, mine: Any, world: int) -> list[Any]:
        calls["gathers"] += 1
        return real_gather(self, mine, world)

    dist.broadcast = broadcast
    FlashCheckpointer._gather = gather  # pyright: ignore[reportPrivateUsage]
    restored = FlashCheckpointer(folder).load()
    dist.broadcast, FlashCheckpointer._gather = real_broadcast, real_gather  # pyright: ignore[reportPrivateUsage]
    assert restored is not None
    found = {
        "step": restored.step,
        "source": restored.source,
        **calls,
        "state": tensor_bytes(restored.state),
        "expected": tensor_bytes(state(restored.step)),
    }
    out.write_text(json.dumps(found))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
