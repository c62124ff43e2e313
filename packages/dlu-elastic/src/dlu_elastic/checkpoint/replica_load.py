"""`load()`'s use of replicas: which step all ranks can restore, and the bytes moved to a rank
whose own agent lost its slots (a new agent after a node loss) from the rank that keeps them.

Every rank gathers (rank, own complete steps, newest step reached, replicas its agent keeps).
A rank can restore a step from its own slots or from any rank's replica of it; the step is the
newest one every rank can restore. A rank without it in memory receives the replica's
metadata and payload from its holder (torch.distributed send/recv: every rank walks the same
plan in the same order).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from dlu_elastic.checkpoint import replica
from dlu_elastic.checkpoint.slot import Header

# What a rank says it keeps: replica file name -> (rank, world, step, meta_len, payload_len).
Held = dict[str, tuple[int, int, int, int, int]]


@dataclass(frozen=True)
class Source:
    """Where rank `rank` gets the step from someone else's replica."""

    rank: int
    holder: int
    name: str
    meta_len: int
    payload_len: int


def held(folder: Path) -> Held:
    return {name: _describe(h) for name, h in replica.held(folder).items()}


def _describe(h: Header) -> tuple[int, int, int, int, int]:
    return h.rank, h.world, h.step, h.meta_len, h.payload_len


def plan(
    everyone: Sequence[tuple[int, dict[int, tuple[int, int]], int | None, Held]], world: int
) -> tuple[int, dict[int, Source]] | None:
    """The newest step every rank can restore and, per rank that needs one, its replica's holder."""
    avail: dict[int, set[int]] = {r: set() for r in range(world)}
    own: dict[int, set[int]] = {r: set() for r in range(world)}
    for rank, mine, _, _ in everyone:
        own[rank] = {s for s, rw in mine.items() if rw == (rank, world)}
        avail[rank] |= own[rank]
    for _, _, _, keeps in everyone:
        for r, w, step, _, _ in keeps.values():
            if w == world and r in avail:
                avail[r].add(step)
    common = set.intersection(*avail.values()) if avail else set()
    if not common:
        return None
    step = max(common)
    sources: dict[int, Source] = {}
    for r in range(world):
        if step in own[r]:
            continue
        holder, name, meta_len, payload_len = min(
            (h, name, m, p)
            for h, _, _, keeps in everyone
            for name, (rr, w, s, m, p) in keeps.items()
            if (rr, w, s) == (r, world, step)
        )
        sources[r] = Source(r, holder, name, meta_len, payload_len)
    return step, sources


def why_none(everyone: Sequence[tuple[int, dict[int, tuple[int, int]], int | None, Held]], world: int) -> str:
    """Why `plan` found no step (for the restore event): the ranks with no copy at all (a new
    agent whose buddy had no replica yet, or was lost with it), else each rank's steps."""
    avail: dict[int, set[int]] = {r: set() for r in range(world)}
    for rank, mine, _, keeps in everyone:
        avail[rank] |= {s for s, rw in mine.items() if rw == (rank, world)}
        for r, w, step, _, _ in keeps.values():
            if w == world and r in avail:
                avail[r].add(step)
    bare = [r for r in range(world) if not avail[r]]
    if bare:
        ranks = ", ".join(map(str, bare))
        return f"rank {ranks} had no step in memory or in a buddy's replica"
    steps = "; ".join(f"rank {r}: {sorted(avail[r])}" for r in range(world))
    return f"no step is kept in memory for every rank ({steps})"


def exchange(folder: Path, rank: int, sources: dict[int, Source]) -> tuple[bytes, memoryview] | None:
    """Send the replicas this rank holds to the ranks that need them; return this rank's
    (metadata, payload) when it needs one. Every rank calls it with the same `sources`."""
    import torch.distributed as dist

    mine: tuple[bytes, memoryview] | None = None
    for r in sorted(sources):
        src = sources[r]
        if src.holder == rank:
            data = bytearray(replica.read(folder, src.name))
            if r == rank:
                mine = _split(data, src)
                continue
            dist.send(torch.frombuffer(data, dtype=torch.uint8).to(_device()), dst=r)
        elif r == rank:
            data = bytearray(src.meta_len + src.payload_len)
            host = torch.frombuffer(data, dtype=torch.uint8)
            device = _device()
            buf = host if device == "cpu" else torch.empty_like(host, device=device)
            dist.recv(buf, src=src.holder)
            if buf is not host:
                host.copy_(buf)
            mine = _split(data, src)
    return mine


def _device() -> str:
    import torch.distributed as dist

    return "cuda" if dist.get_backend() == "nccl" else "cpu"


def _split(data: bytearray, src: Source) -> tuple[bytes, memoryview]:
    if len(data) != src.meta_len + src.payload_len:
        raise OSError(f"rank {src.rank}'s replica held by rank {src.holder} has {len(data)} bytes")
    view = memoryview(data)
    return bytes(view[: src.meta_len]), view[src.meta_len :]
