"""Durable copies of committed slots: `<dir>/<role>/step-<N>/rank-<r>-of-<w>.slot`.

A file is the slot's header, metadata and payload back to back, written to a temporary name,
fsynced and renamed, so a file that exists is whole. A step is on disk when all `w` ranks'
files of it exist: the same "every rank has it" rule as in memory, checked by listing.
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

from dlu_elastic.checkpoint.slot import HEADER, Snapshot, read_header

_STEP = re.compile(r"^step-(\d+)$")
_RANK = re.compile(r"^rank-(\d+)-of-(\d+)\.slot$")


def step_folder(base: Path, step: int) -> Path:
    return base / f"step-{step:012d}"


def file_name(rank: int, world: int) -> str:
    return f"rank-{rank}-of-{world}.slot"


def write(base: Path, snap: Snapshot) -> Path:
    """Write one rank's committed slot durably; raises OSError when the disk refuses."""
    h = snap.header
    folder = step_folder(base, h.step)
    folder.mkdir(parents=True, exist_ok=True)
    final = folder / file_name(h.rank, h.world)
    tmp = folder / f".{final.name}.{os.getpid()}.tmp"
    try:
        with open(tmp, "wb") as out:
            header = bytearray(HEADER.size)
            HEADER.pack_into(
                header, 0, b"DLUCKPT1", h.seq, h.step, h.meta_len, h.payload_len, h.rank, h.world
            )
            out.write(header)
            out.write(snap.meta)
            out.write(snap.payload)
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, final)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return final


def complete_steps(base: Path) -> dict[int, int]:
    """Steps whose every rank's file exists: step -> world size."""
    found: dict[int, int] = {}
    try:
        folders = list(base.iterdir())
    except (FileNotFoundError, NotADirectoryError):
        return found
    for folder in folders:
        match = _STEP.match(folder.name)
        if not match:
            continue
        ranks: dict[int, set[int]] = {}
        for item in folder.iterdir():
            rank = _RANK.match(item.name)
            if rank:
                ranks.setdefault(int(rank.group(2)), set()).add(int(rank.group(1)))
        for world, have in ranks.items():
            if have == set(range(world)):
                found[int(match.group(1))] = world
    return found


def read(base: Path, step: int, rank: int, world: int) -> Snapshot:
    path = step_folder(base, step) / file_name(rank, world)
    data = path.read_bytes()
    header = read_header(data)
    if header is None:
        raise OSError(f"{path} is not a DLU checkpoint file")
    meta = data[HEADER.size : HEADER.size + header.meta_len]
    start = HEADER.size + header.meta_len
    return Snapshot(header, meta, bytearray(data[start : start + header.payload_len]))


def prune(base: Path, rank: int, keep_from: int) -> None:
    """Remove this rank's files of steps older than `keep_from` (a newer step is complete)."""
    try:
        folders = list(base.iterdir())
    except FileNotFoundError:
        return
    for folder in folders:
        match = _STEP.match(folder.name)
        if not match or int(match.group(1)) >= keep_from:
            continue
        for item in folder.iterdir():
            found = _RANK.match(item.name)
            if found and int(found.group(1)) == rank:
                item.unlink(missing_ok=True)
        if not any(folder.iterdir()):
            shutil.rmtree(folder, ignore_errors=True)
