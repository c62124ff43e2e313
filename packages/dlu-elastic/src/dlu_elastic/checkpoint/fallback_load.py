"""`load()` when no step of this world is in every rank's memory: after a resize, old rank 0's
state from whichever rank's agent keeps it (the copy `resize_load.plan` picks); else the newest
step every rank persisted to disk (see disk.py), of this world or, after a resize, old rank 0's
shared (DDP) state of another.

Functions of the folders they read, not FlashCheckpointer methods: the checkpointer passes its
`gather` (every rank's value, through the round's TCPStore) and its `share_empty` (a DDP job's
rank 0 state for every rank), so the save side and the memory path stay in api.py.
"""

from __future__ import annotations

import logging
import pickle
from collections.abc import Callable
from pathlib import Path
from typing import Any

from dlu_elastic.checkpoint import disk, replica, replica_load, resize_load
from dlu_elastic.checkpoint.broadcast import Gather, broadcast_state
from dlu_elastic.checkpoint.errors import CheckpointError
from dlu_elastic.checkpoint.layout import unpack
from dlu_elastic.checkpoint.restored import Restored
from dlu_elastic.checkpoint.slot import SLOTS, read_meta, read_with, slot_path

logger = logging.getLogger(__name__)

ShareEmpty = Callable[[tuple[bool, Any]], Any]  # (saved None, state) -> this rank's state


def other_worlds(folder: Path, rank: int, world: int, held: replica_load.Held) -> list[resize_load.Copy]:
    """The complete slots and replicas this rank's agent keeps of another world size."""
    found: list[resize_load.Copy] = []
    names = [slot_path(folder, i).name for i in range(SLOTS)]
    names += [n for n, (_, w, _, _, _) in held.items() if w != world]
    for name in names:
        read = read_meta(folder / name)
        if read is None or read[0].world == world:
            continue
        header, meta = read
        shared = bool(pickle.loads(meta).get("shared"))
        found.append(resize_load.Copy(rank, header.rank, header.world, header.step, shared, name))
    return found


def from_old_world(folder: Path, rank: int, world: int, plan: resize_load.Plan, gather: Gather) -> Restored:
    """Old rank 0's state of `plan.step`, read by the rank whose agent keeps it, for all (the
    caller then voids its slots: the old world's, this world saves afresh)."""
    src = plan.source
    value: Any = None
    if rank == src.holder:
        path = folder / src.name
        if src.name.startswith("slot-"):
            read = read_with(path, lambda _h, meta, payload: unpack(meta, payload))
        else:
            data = replica.read(folder, src.name)
            header = read_meta(path)
            meta_len = header[0].meta_len if header is not None else 0
            read = unpack(data[:meta_len], memoryview(data)[meta_len:])
        if read is None:
            raise CheckpointError(f"{path} changed while it was read")
        value = read[1]
    state = broadcast_state(value, src.holder, gather) if world > 1 else value
    why = f"resized from {plan.old_world} to {world} ranks: old rank 0's state for every rank"
    where = f"rank {src.holder}'s agent ({src.name})"
    return Restored(plan.step, state, "memory", where, why=why)


def from_disk(
    persist_dir: Path | None, rank: int, world: int, gather: Gather, share_empty: ShareEmpty
) -> Restored | None:
    """The newest step on disk that every rank sees complete (the ranks agree first, so
    none resumes alone from another step); None when there is none or it cannot be read."""
    step, of_world = disk_step(persist_dir, world)
    agreed = set(gather((step, of_world)))
    if len(agreed) != 1 or step is None or persist_dir is None:
        return None
    read_rank = rank if of_world == world else 0  # another world: its rank 0's (shared) state
    try:
        snap = disk.read(persist_dir, step, read_rank, of_world)
    except OSError as exc:
        raise CheckpointError(
            f"step {step} is complete in {persist_dir} but rank {rank} cannot read its file: {exc}"
        ) from exc
    where = str(disk.step_folder(persist_dir, step))
    state = unpack(snap.meta, memoryview(snap.payload))
    if of_world != world:
        why = f"resized from {of_world} to {world} ranks: old rank 0's state for every rank"
        return Restored(step, state[1], "disk", where, why=why)
    return Restored(step, share_empty(state), "disk", where)


def disk_step(persist_dir: Path | None, world: int) -> tuple[int | None, int]:
    """The newest step on disk at this world size; else (after a resize) the newest one of
    another world whose rank 0 saved a shared (DDP) state: (step or None, its world)."""
    if persist_dir is None:
        return None, world
    try:
        complete = disk.complete_steps(persist_dir)
    except OSError as exc:  # an unreadable folder is no checkpoint, never a crash of training
        logger.warning("cannot list the persisted checkpoints in %s: %s", persist_dir, exc)
        return None, world
    same = [s for s, w in complete.items() if w == world]
    if same:
        return max(same), world
    for step, of_world in sorted(complete.items(), reverse=True):
        path = disk.step_folder(persist_dir, step) / disk.file_name(0, of_world)
        read = read_meta(path)
        if read is not None and pickle.loads(read[1]).get("shared"):
            return step, of_world
    return None, world
