"""One rank's restored state handed to every rank (tensors broadcast, the skeleton gathered):
a DDP job's ranks that saved `None` get rank 0's state, and after a resize every rank gets old
rank 0's state from whichever rank's agent keeps it.

The tensors travel as one packed buffer (the slot's own layout: `layout.table`), in a single
collective: a broadcast per tensor cost a round trip each (113 for the reference job's model
and AdamW state, 0.13 to 0.19 s of its in-place restart on two loaded cores).
"""

from __future__ import annotations

import pickle
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from dlu_elastic.checkpoint.layout import CheckpointError, TensorEntry, dtype_of, fill, split, table
from dlu_elastic.checkpoint.slot import read_meta

Gather = Callable[[Any], list[Any]]
Layout = tuple[Any, list[TensorEntry], int]  # (skeleton, entries, packed bytes)
# What a rank tells the others with its news at load(), per complete step of its own slots:
# (the slot's seq, whether it saved None, its layout: rank 0's, the others send None). With it
# the ranks know before reading a slot whether rank 0's state must reach them, and how to
# unpack it: no gather of its own (a TCPStore round trip of every rank) on an in-place restart.
Told = tuple[int, bool, Layout | None]


def tell(slots: dict[int, Path], rank: int) -> dict[int, Told]:
    """This rank's `Told` of each step in `slots` (step -> its slot file) it can read."""
    found: dict[int, Told] = {}
    for step, path in slots.items():
        read = read_meta(path)
        if read is None:
            continue
        header, raw = read
        meta = pickle.loads(raw)
        empty = bool(meta.get("empty"))
        layout = (meta["skeleton"], meta["entries"], header.payload_len) if rank == 0 and not empty else None
        found[step] = (header.seq, empty, layout)
    return found


def layout_of(value: Any) -> Layout:
    """What the receivers need to allocate and unpack `value`'s buffer."""
    skeleton, tensors = split(value)
    entries, nbytes = table(tensors)
    return skeleton, entries, nbytes


def pack(value: Any, entries: list[TensorEntry], nbytes: int) -> torch.Tensor:
    """`value`'s tensors copied into one byte buffer at their `entries` offsets."""
    _, tensors = split(value)
    if len(tensors) != len(entries):
        raise CheckpointError(f"{len(tensors)} tensors to pack for a layout of {len(entries)}")
    packed = torch.empty(nbytes, dtype=torch.uint8)
    for entry, (_, tensor) in zip(entries, tensors, strict=True):
        if entry.nbytes:
            src = tensor.detach().reshape(-1).view(torch.uint8)
            packed[entry.offset : entry.offset + entry.nbytes].copy_(src)
    return packed


def unpack(skeleton: Any, entries: list[TensorEntry], packed: torch.Tensor) -> Any:
    """The state rebuilt from a packed buffer, each tensor its own copy (no tensor keeps the
    whole buffer alive once its neighbours are dropped, as after `load_state_dict`)."""
    end = max((e.offset + e.nbytes for e in entries), default=0)
    if packed.dtype != torch.uint8 or packed.dim() != 1 or packed.numel() < end:
        raise CheckpointError(f"a packed state of {packed.numel()} bytes for a layout of {end}")
    out: list[torch.Tensor] = []
    for entry in entries:
        dtype = dtype_of(entry.dtype)
        if not entry.nbytes:
            out.append(torch.empty(entry.shape, dtype=dtype))
            continue
        raw = packed[entry.offset : entry.offset + entry.nbytes]
        out.append(raw.clone().view(dtype).reshape(entry.shape))
    return fill(skeleton, out)


def broadcast_state(value: Any, src: int, gather: Gather, layout: Layout | None = None) -> Any:
    """`value` (meaningful on rank `src` only) on every rank; `gather` is the caller's
    all-gather (every rank calls this with the same `src`). `layout`: `layout_of(value)` as
    every rank already knows it (the caller gathered it with something else), else gathered."""
    import torch.distributed as dist

    rank = dist.get_rank()
    if layout is None:
        layout = gather(layout_of(value) if rank == src else None)[src]
    assert layout is not None
    skeleton, entries, nbytes = layout
    if not nbytes:
        return value if rank == src else unpack(skeleton, entries, torch.empty(0, dtype=torch.uint8))
    device = "cuda" if dist.get_backend() == "nccl" else "cpu"
    if rank == src:
        buf = pack(value, entries, nbytes).to(device)
    else:
        buf = torch.empty(nbytes, dtype=torch.uint8, device=device)
    dist.broadcast(buf, src=src)
    return value if rank == src else unpack(skeleton, entries, buf.cpu())
