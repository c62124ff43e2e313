"""A rank's share of a fixed global batch, so that the effective batch of a step stays the same
when an elastic role shrinks or grows.

Pure arithmetic on (global batch, world size, rank): the world is read from the environment
torchrun-style code already has (`WORLD_SIZE`, `RANK`), which DLU sets again at every
rendezvous round. Ranks split the global batch's samples into contiguous ranges, the first
`global_batch % world_size` ranks taking one more, and each rank cuts its range into
micro-batches (gradient accumulation).

With uneven shares a rank's mean loss would weigh its samples wrongly once DDP averages the
ranks' gradients; `loss_scale` fixes that: multiply the *sum* of a micro-batch's per-sample
losses by it before `backward()`, and the averaged gradient is exactly the mean over the whole
global batch, whatever the world size.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass


class BatchShareError(ValueError):
    """The global batch cannot be shared as asked (the message names the value and the fix)."""


@dataclass(frozen=True)
class BatchShare:
    global_batch: int
    world_size: int
    rank: int
    start: int
    """First sample of this rank's range within the global batch."""
    stop: int
    micro_batch: int

    @property
    def samples(self) -> int:
        return self.stop - self.start

    @property
    def accumulation_steps(self) -> int:
        """Micro-batches this rank runs per step (the last one may be smaller)."""
        return -(-self.samples // self.micro_batch)

    @property
    def loss_scale(self) -> float:
        """Factor for the sum of per-sample losses before `backward()` under DDP averaging."""
        return self.world_size / self.global_batch

    def micro_batches(self) -> Iterator[slice]:
        """Slices of the global batch's samples, one per accumulation step."""
        for begin in range(self.start, self.stop, self.micro_batch):
            yield slice(begin, min(begin + self.micro_batch, self.stop))


def batch_share(
    global_batch: int,
    micro_batch: int | None = None,
    *,
    world_size: int | None = None,
    rank: int | None = None,
) -> BatchShare:
    """This rank's share of `global_batch` samples per step, cut into micro-batches of at most
    `micro_batch` (default: the whole share at once). `world_size` and `rank` default to the
    environment's `WORLD_SIZE` and `RANK` (1 and 0 outside a distributed run).

    Raises:
        BatchShareError: a size below 1, a rank outside the world, or fewer samples than ranks
            (every rank must take part in each step's collectives with at least one sample).
    """
    world = world_size if world_size is not None else int(os.environ.get("WORLD_SIZE", "1"))
    me = rank if rank is not None else int(os.environ.get("RANK", "0"))
    if global_batch < 1:
        raise BatchShareError(f"global_batch={global_batch}: give the samples per step, a whole number >= 1")
    if world < 1:
        raise BatchShareError(f"world_size={world}: give a whole number >= 1 (or set WORLD_SIZE)")
    if not 0 <= me < world:
        raise BatchShareError(f"rank={me} is outside a world of {world}: give 0 <= rank < world_size")
    if global_batch < world:
        raise BatchShareError(
            f"global_batch={global_batch} is smaller than the world ({world} ranks): every rank needs a "
            f"sample, so give global_batch >= {world} (or cap the role's nodes with nnodes MIN:MAX)"
        )
    if micro_batch is not None and micro_batch < 1:
        raise BatchShareError(f"micro_batch={micro_batch}: give a whole number >= 1, or leave it out")
    base, extra = divmod(global_batch, world)
    start = me * base + min(me, extra)
    stop = start + base + (1 if me < extra else 0)
    return BatchShare(global_batch, world, me, start, stop, micro_batch or stop - start)
