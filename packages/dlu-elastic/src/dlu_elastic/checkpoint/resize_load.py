"""`load()` after a resize: the newest committed step of the previous world, when it can serve
the new one.

A plain DDP state (saved on rank 0, `None` elsewhere: every save records it as `shared`) is
rank 0's alone: any number of ranks can take it, so the newest committed step of the old world
is restored from the copy of old rank 0's slot that some rank's agent keeps (its own slots or a
replica), broadcast to every rank. A sharded state (each rank its shard) cannot be resharded
generically: `plan` says so, and load() falls back to the persisted copies of the new world.

Committed, in a world that no longer exists (its TCPStore counters went with its round): a step
every old rank holds, or the older step of some old rank's two complete slots (a rank starts
writing its other slot only once the step it keeps is committed: see api.py; not so for a
rank's two replicas, one of which may lag behind its slot).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Copy:
    """One complete slot of another world that rank `holder`'s agent keeps."""

    holder: int
    rank: int  # the rank that saved it, in `world`
    world: int
    step: int
    shared: bool  # rank 0's state for every rank (a DDP job): any world can take it
    name: str  # in the holder's folder: "slot-<i>" or "replica-<rank>-<slot>"


@dataclass(frozen=True)
class Plan:
    step: int
    source: Copy
    old_world: int


def committed(copies: Sequence[Copy], world: int, step: int) -> bool:
    """Whether `step` of `world` is proven committed by the copies (see the module docstring)."""
    same = [c for c in copies if c.world == world]
    if {c.rank for c in same if c.step == step} >= set(range(world)):
        return True
    pairs: dict[tuple[int, int], set[int]] = {}  # (holder, rank) -> the steps of its own two slots
    for c in same:
        if c.name.startswith("slot-"):  # not replicas: one may lag behind its slot
            pairs.setdefault((c.holder, c.rank), set()).add(c.step)
    return any(len(steps) == 2 and min(steps) == step for steps in pairs.values())


def plan(copies: Sequence[Copy], world: int) -> Plan | str | None:
    """The step to restore into `world` and the copy to broadcast; a reason (str) when the old
    world's newest committed step cannot serve this one; None when no other world left a step."""
    others = [c for c in copies if c.world != world]
    if not others:
        return None
    candidates = sorted(
        (c for c in others if c.rank == 0 and committed(others, c.world, c.step)),
        key=lambda c: (c.step, c.world, -c.holder),
        reverse=True,
    )
    if not candidates:
        worlds = sorted({c.world for c in others})
        return (
            f"no committed step of the previous world ({' or '.join(map(str, worlds))} ranks) is kept whole"
        )
    best = candidates[0]
    if not best.shared:
        return (
            f"step {best.step} was saved sharded over {best.world} ranks and the world has {world}: "
            "a sharded state is not resharded"
        )
    return Plan(best.step, best, best.world)
