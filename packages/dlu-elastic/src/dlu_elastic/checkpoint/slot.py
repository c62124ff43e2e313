"""One slot: a file in the agent's shared-memory folder holding one rank's state of one step.

Layout: a 64-byte header, the pickled metadata (at most `META_CAPACITY`), and the tensors'
bytes from `PAYLOAD_OFFSET`. The header's `seq` is odd while a save writes the slot and even
once it is complete, written last: a process killed mid-save leaves an odd `seq`, which every
reader takes as "no step here"; a reader racing a writer (the agent's persister) copies, then
checks `seq` did not move. Files only grow (a reader's mapping never loses pages under it),
and their pages are reserved with `posix_fallocate`, so a full /dev/shm is a clear error at
the first save rather than a SIGBUS in the middle of one.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import shutil
import struct
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from dlu_elastic.checkpoint.errors import CheckpointError

if TYPE_CHECKING:  # the agent reads and copies slots without torch; only payload() needs it
    import torch

MAGIC = b"DLUCKPT1"
HEADER = struct.Struct("<8sQqQQQQ")  # magic, seq, step, meta_len, payload_len, rank, world
META_CAPACITY = (1 << 20) - 64
PAYLOAD_OFFSET = 1 << 20
SLOTS = 2
T = TypeVar("T")


class ShmFull(CheckpointError):
    """The slots do not fit in the shared-memory folder's free space."""


@dataclass(frozen=True)
class Header:
    seq: int
    step: int
    meta_len: int
    payload_len: int
    rank: int
    world: int

    @property
    def complete(self) -> bool:
        return self.seq % 2 == 0 and self.seq > 0


@dataclass
class Snapshot:
    """A complete slot copied out: its header, metadata bytes and payload."""

    header: Header
    meta: bytes
    payload: bytearray


def slot_path(folder: Path, index: int) -> Path:
    return folder / f"slot-{index}"


def read_header(buf: Any) -> Header | None:
    if len(buf) < HEADER.size:
        return None
    magic, seq, step, meta_len, payload_len, rank, world = HEADER.unpack_from(buf, 0)
    if magic != MAGIC:
        return None
    return Header(seq, step, meta_len, payload_len, rank, world)


def human(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024
    return f"{n:.1f} GiB"


class SlotWriter:
    """The training process's mapping of one slot, kept across saves (maps once, grows only)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        self.map: mmap.mmap | None = None
        self.size = 0
        size = os.fstat(self.fd).st_size
        if size >= PAYLOAD_OFFSET:
            self._map(size)

    def _map(self, size: int) -> None:
        self.map = mmap.mmap(self.fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        self.size = size

    def header(self) -> Header | None:
        return read_header(self.map) if self.map is not None else None

    def reserve(self, payload_len: int, others: int) -> None:
        """Grow the file to hold `payload_len` bytes; refuse clearly when /dev/shm cannot."""
        need = PAYLOAD_OFFSET + payload_len
        if need <= self.size:
            return
        usage = shutil.disk_usage(self.path.parent)
        allocated = os.fstat(self.fd).st_blocks * 512
        missing = need - allocated + others
        if missing > usage.free:
            raise ShmFull(
                f"a checkpoint needs {human(need)} per slot ({SLOTS} slots per rank, "
                f"{human(missing)} more in all) but {self.path.parent.parent} has {human(usage.free)} "
                "free: shrink the state, or enlarge /dev/shm (docker --shm-size, a tmpfs mount)"
            )
        try:
            os.posix_fallocate(self.fd, 0, need)
        except OSError as exc:
            raise ShmFull(
                f"could not reserve {human(need)} for a checkpoint slot in {self.path.parent}: {exc}"
            ) from exc
        if self.map is not None:
            self.map.close()  # no tensor views outlive a save: see FlashCheckpointer.save
        self._map(need)

    def begin(self, rank: int, world: int, step: int = -1) -> int:
        """Mark the slot as being written (odd seq) with the step under way (-1: none, the slot
        is only voided); returns the seq to finish with."""
        assert self.map is not None
        old = self.header()
        seq = (old.seq if old is not None else 0) | 1
        if old is not None and old.seq % 2 == 1:
            seq = old.seq + 2  # a save killed mid-way: still odd, still not a step
        HEADER.pack_into(self.map, 0, MAGIC, seq, step, 0, 0, rank, world)
        return seq + 1

    def write_meta(self, meta: bytes) -> None:
        assert self.map is not None
        if len(meta) > META_CAPACITY:
            raise CheckpointError(
                f"the state's metadata pickles to {human(len(meta))}, over the {human(META_CAPACITY)} "
                "a slot holds: put large values in tensors"
            )
        self.map[HEADER.size : HEADER.size + len(meta)] = meta

    def finish(self, seq: int, step: int, meta_len: int, payload_len: int, rank: int, world: int) -> None:
        assert self.map is not None
        HEADER.pack_into(self.map, 0, MAGIC, seq - 1, step, meta_len, payload_len, rank, world)
        struct.pack_into("<Q", self.map, 8, seq)  # even: complete, written last

    def payload(self, nbytes: int) -> torch.Tensor:
        """A byte tensor over the payload (drop it before the next `reserve`)."""
        assert self.map is not None
        import torch

        return torch.frombuffer(self.map, dtype=torch.uint8, count=nbytes, offset=PAYLOAD_OFFSET)

    def close(self) -> None:
        if self.map is not None:
            with contextlib.suppress(BufferError):  # a view is alive: the mapping goes with the process
                self.map.close()
            self.map = None
        os.close(self.fd)


def snapshot(path: Path) -> Snapshot | None:
    """A consistent copy of a complete slot, or None (missing, mid-save, or raced by a save)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return None
    try:
        size = os.fstat(fd).st_size
        if size < PAYLOAD_OFFSET:
            return None
        with mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ) as view:
            header = read_header(view)
            if header is None or not header.complete or PAYLOAD_OFFSET + header.payload_len > size:
                return None
            meta = bytes(view[HEADER.size : HEADER.size + header.meta_len])
            payload = bytearray(header.payload_len)
            with memoryview(view) as whole:  # one copy (slicing the mmap itself would make two)
                memoryview(payload)[:] = whole[PAYLOAD_OFFSET : PAYLOAD_OFFSET + header.payload_len]
            after = read_header(view)
        if after is None or after.seq != header.seq:
            return None
        return Snapshot(header, meta, payload)
    finally:
        os.close(fd)


def read_with(path: Path, build: Callable[[Header, bytes, memoryview], T]) -> T | None:
    """`build(header, meta, payload)` run on a complete slot in place (no intermediate copy:
    `build` copies what it keeps), or None when the slot is missing, torn or was rewritten."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return None
    try:
        size = os.fstat(fd).st_size
        if size < PAYLOAD_OFFSET:
            return None
        # A private mapping: writable views for torch.frombuffer, nothing written back.
        view = mmap.mmap(fd, size, mmap.MAP_PRIVATE, mmap.PROT_READ | mmap.PROT_WRITE)
        try:
            header = read_header(view)
            if header is None or not header.complete or PAYLOAD_OFFSET + header.payload_len > size:
                return None
            meta = bytes(view[HEADER.size : HEADER.size + header.meta_len])
            with memoryview(view) as whole:
                built = build(header, meta, whole[PAYLOAD_OFFSET : PAYLOAD_OFFSET + header.payload_len])
            after = read_header(view)
        finally:
            with contextlib.suppress(BufferError):
                view.close()
        return built if after is not None and after.seq == header.seq else None
    finally:
        os.close(fd)


def headers(folder: Path) -> list[Header | None]:
    """Both slots' headers (None: missing or not a slot)."""
    found: list[Header | None] = []
    for index in range(SLOTS):
        try:
            with open(slot_path(folder, index), "rb") as file:
                found.append(read_header(file.read(HEADER.size)))
        except FileNotFoundError:
            found.append(None)
    return found


def read_meta(path: Path) -> tuple[Header, bytes] | None:
    """The header and metadata of a complete slot, replica or persisted file (all three put the
    metadata right after the header), without its payload; None when there is none."""
    try:
        with open(path, "rb") as file:
            header = read_header(file.read(HEADER.size))
            if header is None or not header.complete:
                return None
            meta = file.read(header.meta_len)
    except FileNotFoundError:
        return None
    return (header, meta) if len(meta) == header.meta_len else None
