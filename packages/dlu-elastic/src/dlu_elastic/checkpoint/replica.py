"""Replicas on a buddy node: each rank's two slots also live in another node's agent.

Ring order over the nodes: the agent of (node n, local rank l) sends to the agent of (node
n+1 mod N, local rank l). A thread of the agent watches its rank's two slots; each time a slot
holds a newly completed step it takes a consistent copy and hands the bytes to the buddy
agent's `receive_replica`, which keeps them as `replica-<rank>-<slot>` (written to a temporary
name and renamed, so a file that exists is whole) in its own shared-memory folder, cleaned with
it: two files per buddied rank, mirroring its slots. Mirroring both slots (not only the
committed one) matters: the survivors keep the last committed step and the one after it, and
the buddy's copy of the lost rank holds the same two steps, save for a copy still under way,
so a step every rank can restore remains. All of it runs after `save()` returned; a failed copy
is logged and reported once per run of failures as a `checkpoint_replica_failed` event, then
tried again after a pause that doubles up to 1 s: never a crash. `load()` (replica_load.py)
takes a rank's step from a replica when its own agent lost it.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Callable
from pathlib import Path

from dlu_elastic.checkpoint.slot import (
    HEADER,
    SLOTS,
    Header,
    Snapshot,
    headers,
    read_header,
    slot_path,
    snapshot,
)

logger = logging.getLogger(__name__)

TICK_S = 0.05
RETRY_FIRST_S = 0.2  # after a failed copy, the pause before the next try (doubling up to the max)
RETRY_MAX_S = 1.0  # short: a buddy still starting (or replaced) is there again soon
CALL_TIMEOUT_S = 60.0
_REPLICA = re.compile(r"^replica-(\d+)-(\d+)$")

EventSink = Callable[[str, str], None]


def buddy_rank(rank: int, world: int, local_world: int) -> int | None:
    """The actor rank that keeps `rank`'s replica: same local rank, next node; None with one node."""
    nodes = world // max(1, local_world)
    if nodes < 2:
        return None
    node, local = divmod(rank, local_world)
    return ((node + 1) % nodes) * local_world + local


def encode(snap: Snapshot) -> bytes:
    """A slot copy as one byte string: header, metadata, payload (the disk files' format)."""
    h = snap.header
    head = bytearray(HEADER.size)
    HEADER.pack_into(head, 0, b"DLUCKPT1", h.seq, h.step, h.meta_len, h.payload_len, h.rank, h.world)
    return bytes(head) + snap.meta + bytes(snap.payload)


def store(folder: Path, slot: int, data: bytes) -> Path:
    """Keep a received copy of a rank's slot (one file per rank and slot, replaced whole)."""
    header = read_header(data)
    if header is None or len(data) < HEADER.size + header.meta_len + header.payload_len:
        raise ValueError("a replica that is not a whole DLU checkpoint slot")
    if slot not in range(SLOTS):
        raise ValueError(f"slot {slot} is not one of a rank's {SLOTS} slots")
    final = folder / f"replica-{header.rank}-{slot}"
    tmp = folder / f".{final.name}.tmp"
    with open(tmp, "wb") as out:
        out.write(data)
    tmp.replace(final)
    return final


def held(folder: Path) -> dict[str, Header]:
    """The replicas this folder keeps: file name -> header (complete ones only)."""
    found: dict[str, Header] = {}
    try:
        names = [p for p in folder.iterdir() if _REPLICA.match(p.name)]
    except FileNotFoundError:
        return found
    for path in names:
        try:
            with open(path, "rb") as file:
                header = read_header(file.read(HEADER.size))
        except FileNotFoundError:
            continue
        if header is not None and header.complete:
            found[path.name] = header
    return found


def read(folder: Path, name: str) -> bytes:
    """A kept replica's metadata and payload, back to back (what a holder sends)."""
    data = (folder / name).read_bytes()
    header = read_header(data)
    if header is None:
        raise OSError(f"{folder / name} is not a DLU checkpoint replica")
    return data[HEADER.size : HEADER.size + header.meta_len + header.payload_len]


class Replicator:
    """The agent's thread that copies each newly completed slot of its rank to the buddy."""

    def __init__(
        self,
        folder: Path,
        rank: int,
        send: Callable[[int, bytes], None],
        on_event: EventSink,
        tick_s: float = TICK_S,
    ) -> None:
        self.folder = folder
        self.rank = rank
        self.send = send  # hands (slot, copy) to the buddy agent (raises when it cannot)
        self.on_event = on_event
        self.tick_s = tick_s
        self.sent: dict[int, int] = {}  # slot -> seq of the copy the buddy has
        self.copies = 0
        self.failures = 0
        self._failing = False
        self._retry_at = 0.0
        self._pause = RETRY_FIRST_S
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="dlu-ckpt-replica", daemon=True)

    def start(self) -> Replicator:
        self._thread.start()
        return self

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout)

    def _run(self) -> None:
        while not self._stop.wait(self.tick_s):
            try:
                self.tick()
            except Exception as exc:  # never let a surprise end the replicas
                self._failed(exc)

    def tick(self) -> None:
        """Send every slot that completed a step since its last copy (the older step first)."""
        if time.monotonic() < self._retry_at:
            return
        due = [
            (h.step, index)
            for index, h in enumerate(headers(self.folder))
            if h is not None and h.complete and self.sent.get(index) != h.seq
        ]
        for _, index in sorted(due):
            snap = snapshot(slot_path(self.folder, index))
            if snap is None:
                continue  # rewritten meanwhile: the next tick sees the new step
            self.send(index, encode(snap))
            self.sent[index] = snap.header.seq
            self.copies += 1
            self._pause = RETRY_FIRST_S
            if self._failing:
                self._failing = False
                self.on_event(
                    "checkpoint_replicated",
                    f"rank {self.rank}: step {snap.header.step} copied to its buddy again",
                )

    def _failed(self, exc: BaseException) -> None:
        self.failures += 1
        self._retry_at = time.monotonic() + self._pause
        self._pause = min(self._pause * 2, RETRY_MAX_S)
        level = logging.DEBUG if self._failing else logging.WARNING  # one warning per run of failures
        logger.log(
            level, "rank %d: could not copy a checkpoint replica to its buddy (retrying): %s", self.rank, exc
        )
        if not self._failing:
            self._failing = True
            self.on_event(
                "checkpoint_replica_failed", f"rank {self.rank}: copy to its buddy failed ({exc}); retrying"
            )
