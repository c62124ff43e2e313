"""One rank's restored state handed to every rank (tensors broadcast, the skeleton gathered):
a DDP job's ranks that saved `None` get rank 0's state, and after a resize every rank gets old
rank 0's state from whichever rank's agent keeps it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from dlu_elastic.checkpoint.layout import dtype_of, fill, split, table

Gather = Callable[[Any], list[Any]]


def broadcast_state(value: Any, src: int, gather: Gather) -> Any:
    """`value` (meaningful on rank `src` only) on every rank; `gather` is the caller's
    all-gather (every rank calls this with the same `src`)."""
    import torch.distributed as dist

    rank = dist.get_rank()
    skeleton, tensors = split(value) if rank == src else (None, [])
    entries = table(tensors)[0] if rank == src else None
    skeleton, entries = gather((skeleton, entries))[src]
    device = "cuda" if dist.get_backend() == "nccl" else "cpu"
    out: list[torch.Tensor] = []
    for index, entry in enumerate(entries):
        if rank == src:
            buf = tensors[index][1].detach().reshape(-1).view(torch.uint8).to(device)
        else:
            buf = torch.empty(entry.nbytes, dtype=torch.uint8, device=device)
        if entry.nbytes:
            dist.broadcast(buf, src=src)
        out.append(buf.cpu().view(dtype_of(entry.dtype)).reshape(entry.shape))
    return value if rank == src else fill(skeleton, out)
