"""Replicas on a buddy node: each rank's two slots also live in another node's agent.

Ring order over the nodes: the agent of (node n, local rank l) sends to the agent of (node
n+1 mod N, local rank l). A thread of the agent watches its rank's two slots; each time a slot
holds a newly completed step it takes a consistent copy and hands the bytes to the buddy
agent's `receive_replica`, which keeps them as `replica-<rank>-<slot>` (written to a temporary
name and renamed, so a file that exists is whole) in its own shared-memory folder, cleaned with
it: two files per buddied rank, mirroring its slots. Mirroring both slots (not only the
committed one) matters: the survivors keep the last committed step and the one after it, and
the buddy's copy of the lost rank holds the same two steps, save for a copy still under way,
so a step every rank can restore remains. A slot voided by a process that starts afresh (it
saves before it loads) has its replica discarded too, so an older run's step never comes back
from a buddy. All of it runs after `save()` returned; a failed copy is logged and reported once
per run of failures as a `checkpoint_replica_failed` event, then tried again after a pause that
doubles up to 1 s (backoff.py): never a crash. `load()` (replica_load.py)
takes a rank's step from a replica when its own agent lost it.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from pathlib import Path

from dlu_elastic.checkpoint.backoff import Backoff
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
from dlu_elastic.checkpoint.ticking import Ticking

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


def discard(folder: Path, rank: int, slot: int) -> None:
    """Forget a rank's replica of a slot that holds no step any more."""
    (folder / f"replica-{rank}-{slot}").unlink(missing_ok=True)


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


VOID = -1  # `Replicator.sent` of a slot whose replica was discarded (the slot holds no step)


class Replicator(Ticking):
    """The agent's thread that copies each newly completed slot of its rank to the buddy.

    No queue: one copy in flight at most, and each tick takes the slots as they are then, the
    newest step first, so a buddy slower than the steps gets the newest steps, skipping the
    ones overwritten meanwhile, and never falls behind by more than the copies under way."""

    def __init__(
        self,
        folder: Path,
        rank: int,
        send: Callable[[int, bytes | None], None],
        on_event: EventSink,
        tick_s: float = TICK_S,
    ) -> None:
        super().__init__("dlu-ckpt-replica", tick_s)
        self.folder = folder
        self.rank = rank
        self.send = send  # hands (slot, copy or None: discard it) to the buddy agent; raises when it cannot
        self.on_event = on_event
        self.sent: dict[int, int] = {}  # slot -> seq of the copy the buddy has (VOID: discarded)
        self.copies = 0
        self.skipped = 0  # slots rewritten before their copy was taken (a newer step went instead)
        self.backoff = Backoff(RETRY_FIRST_S, RETRY_MAX_S)

    @property
    def failures(self) -> int:
        return self.backoff.failures

    def start(self) -> Replicator:
        super().start()
        return self

    def stop(self, timeout: float = 5.0) -> None:
        self.end_thread(timeout)

    def on_error(self, exc: Exception) -> None:  # never let a surprise end the replicas
        self._failed(exc)

    def due(self) -> tuple[list[int], list[int]]:
        """(slots to send, newest step first; slots whose replica to discard: voided by a
        process that started afresh, so an old step on the buddy never outlives its slot)."""
        send: list[tuple[int, int]] = []
        discard: list[int] = []
        for index, h in enumerate(headers(self.folder)):
            if h is None:
                continue
            if h.complete and self.sent.get(index) != h.seq:
                send.append((h.step, index))
            elif not h.complete and h.step < 0 and self.sent.get(index) != VOID:
                discard.append(index)
        return [index for _, index in sorted(send, reverse=True)], discard

    def tick(self) -> None:
        if not self.backoff.ready():
            return
        send, discard = self.due()
        for index in discard:
            self.send(index, None)
            self.sent[index] = VOID
        for index in send:
            snap = snapshot(slot_path(self.folder, index))
            if snap is None:
                self.skipped += 1
                continue  # being rewritten: the next tick sends the newer step
            self.send(index, encode(snap))
            self.sent[index] = snap.header.seq
            self.copies += 1
            if self.backoff.succeeded():
                self.on_event(
                    "checkpoint_replicated",
                    f"rank {self.rank}: step {snap.header.step} copied to its buddy again",
                )

    def _failed(self, exc: BaseException) -> None:
        started = self.backoff.failed()
        level = logging.WARNING if started else logging.DEBUG  # one warning per run of failures
        logger.log(
            level, "rank %d: could not copy a checkpoint replica to its buddy (retrying): %s", self.rank, exc
        )
        if started:
            self.on_event(
                "checkpoint_replica_failed", f"rank {self.rank}: copy to its buddy failed ({exc}); retrying"
            )
