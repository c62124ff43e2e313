"""The bookkeeping behind exactly-once data channels. Pure: no Ray, no asyncio, no clock.

Three rules, each cheap and bounded by the number of producers and consumers, not of items:

- **Idempotent put.** A producer that names itself (`producer`) numbers its items (`seq`,
  increasing). The book keeps, per producer, the highest `seq` it accepted; an item at or
  below it is a duplicate and is dropped. So a restarted producer that re-sends is harmless,
  and `next_seq` tells it where to resume.
- **Sticky redelivery.** An item handed to a consumer stays *leased* to it until that consumer
  acknowledges it. Each process that reads as a consumer has a *session*; a call from a new
  session (the consumer's actor or process restarted) turns the old session's leases into
  *pending* items that only this consumer gets back, first and in order. They never go to
  another consumer, so a stage that numbers its output by its own state re-sends the same
  numbers and the next channel drops them.
- **State with the ack.** A consumer may pass its state along with an acknowledgement; the book
  keeps the last one. The state and the acknowledged items change together, so a restarted
  consumer that `restore`s it resumes exactly after the last item it acknowledged.
"""

from __future__ import annotations

import os
import uuid
from collections import deque
from dataclasses import dataclass, field
from typing import Any

OK = "ok"
CLOSED = "closed"
TIMEOUT = "timeout"
STALE = "stale"

_session: tuple[int, str] | None = None


def session_id() -> str:
    """This process' reader session: new in every process, forked ones included."""
    global _session
    pid = os.getpid()
    if _session is None or _session[0] != pid:
        _session = (pid, f"{pid}-{uuid.uuid4().hex[:12]}")
    return _session[1]


def check_seq(producer: str | None, seq: int | None) -> None:
    """Bad numbering is refused before it reaches the channel, with the fix in the message."""
    if (producer is None) != (seq is None):
        raise ValueError(
            "producer and seq go together: pass both to make the put idempotent, or neither "
            f"(got producer={producer!r}, seq={seq!r})"
        )
    if producer is not None and (not isinstance(producer, str) or not producer):  # pyright: ignore[reportUnnecessaryIsInstance]
        raise ValueError(f"producer must be a non-empty string (e.g. consumer_id()), got {producer!r}")
    if seq is not None and (isinstance(seq, bool) or not isinstance(seq, int) or seq < 0):  # pyright: ignore[reportUnnecessaryIsInstance]
        raise ValueError(f"seq must be an integer >= 0, got {seq!r}")


@dataclass
class Reader:
    """One consumer id: the session reading now, what it holds, and its committed state."""

    session: str
    leased: list[Any] = field(default_factory=list[Any])
    pending: deque[Any] = field(default_factory=deque[Any])
    state: Any = None


class ChannelBook:
    """A channel's items and the exactly-once rules above; the channel actor adds the waiting."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.queue: deque[Any] = deque()
        self.closed = False
        self.last_seq: dict[str, int] = {}
        self.readers: dict[str, Reader] = {}
        self.counts = {"put": 0, "duplicates": 0, "delivered": 0, "acked": 0, "redelivered": 0}

    # producers ---------------------------------------------------------------------------------
    def duplicate(self, producer: str | None, seq: int | None) -> bool:
        """This numbered item was accepted before (a re-send): drop it."""
        if producer is None or seq is None:
            return False
        last = self.last_seq.get(producer)
        return last is not None and seq <= last

    def has_room(self) -> bool:
        return len(self.queue) < self.capacity

    def append(self, item: Any, producer: str | None = None, seq: int | None = None) -> None:
        self.queue.append(item)
        self.counts["put"] += 1
        if producer is not None and seq is not None:
            self.last_seq[producer] = seq

    def drop(self) -> None:
        self.counts["duplicates"] += 1

    def next_seq(self, producer: str) -> int:
        """Where `producer` resumes: one past the highest seq accepted from it (0 if none)."""
        last = self.last_seq.get(producer)
        return 0 if last is None else last + 1

    # consumers ---------------------------------------------------------------------------------
    def enter(self, consumer: str, session: str) -> bool:
        """Makes `session` the consumer's current one. True when it replaces an earlier one
        (a restart): the earlier session's leases become pending, in order, for this consumer."""
        reader = self.readers.get(consumer)
        if reader is None:
            self.readers[consumer] = Reader(session)
            return False
        if reader.session == session:
            return False
        reader.pending.extendleft(reversed(reader.leased))
        self.counts["redelivered"] += len(reader.leased)
        reader.leased = []
        reader.session = session
        return True

    def current(self, consumer: str, session: str) -> bool:
        reader = self.readers.get(consumer)
        return reader is not None and reader.session == session

    def settle(self, consumer: str, session: str, state: Any = None, *, commit: bool = False) -> int:
        """Acknowledges the session's leases (and keeps `state` when `commit`) in one step.
        A session that is no longer current changes nothing; returns how many were acked."""
        reader = self.readers.get(consumer)
        if reader is None or reader.session != session:
            return 0
        acked = len(reader.leased)
        reader.leased = []
        self.counts["acked"] += acked
        if commit:
            reader.state = state
        return acked

    def restore(self, consumer: str, session: str) -> Any:
        """Starts `session` and returns the consumer's last committed state (None if none)."""
        self.enter(consumer, session)
        return self.readers[consumer].state

    def ready(self, consumer: str) -> bool:
        """A `take` would not have to wait: an item for this consumer, or the end."""
        reader = self.readers.get(consumer)
        return bool(reader is not None and reader.pending) or bool(self.queue) or self.closed

    def take(self, consumer: str) -> tuple[str, Any]:
        """Leases the consumer its next item: its own pending ones first, then the queue.
        (CLOSED, None) once both are empty and the channel is closed. Call it when `ready`."""
        reader = self.readers[consumer]
        if reader.pending:
            item = reader.pending.popleft()
        elif self.queue:
            item = self.queue.popleft()
        else:
            return CLOSED, None
        reader.leased.append(item)
        self.counts["delivered"] += 1
        return OK, item

    def stats(self) -> dict[str, int | bool]:
        return {
            "capacity": self.capacity,
            "queued": len(self.queue),
            "leased": sum(len(r.leased) for r in self.readers.values()),
            "pending": sum(len(r.pending) for r in self.readers.values()),
            **self.counts,
            "closed": self.closed,
        }
