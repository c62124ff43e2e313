"""Bounded data channels between roles (the worker self-loop's pipes), exactly once.

A channel is one detached, named async Ray actor per (job, channel); it outlives the job's
actors, so every recovery (an actor restarted alone, or the whole job) finds it as it was.
Producers block while it is full (back-pressure). The bookkeeping is `delivery.ChannelBook`:

- **Producers** that pass `producer=` and an increasing `seq=` are idempotent: a re-sent item
  (seq at or below the last one accepted from that producer) is dropped, even into a closed
  channel, so a restarted producer that replays cannot duplicate nor hit `ChannelClosed`.
  `next_seq(producer)` says where to resume.
- **Consumers** read under a stable id (`consumer_id()`, "job.role.rank"). An item is leased
  until the consumer's next `get` (ack-on-next-get) or `ack`. A restarted consumer (any call
  from a new process) gets its unacknowledged items back first, and only it gets them; a `get`
  its dead incarnation left waiting ends without taking an item.
- **State with the ack**: `get(consumer, state=...)` / `ack(consumer, state=...)` keep the
  consumer's state together with the acknowledgement; `restore(consumer)` returns it after a
  restart. A consumer that commits all its state this way (including the `seq` of what it
  produces) sees and produces every item exactly once across its restarts.

A consumer that keeps no state and produces without `seq` gets at-least-once: it may process
an item again after a restart (never lose one).

`capacity` bounds the queued (not yet delivered) items; leased and pending (given back to a
restarted consumer) items come on top, a few per consumer.

Caveat: the actor keeps its state in memory. It is restarted by Ray (`max_restarts=-1`) if its
own process dies, but it comes back empty and open: queued and leased items are lost, and a
consumer waiting for more blocks until its timeout. Calls in flight at that moment raise
`ChannelUnavailableError`. The PrimeMaster owns channels and records them in its state; they
last for one run of the job (removed when it stops).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable, Iterator
from typing import Any, cast

import ray
from ray.exceptions import RayActorError

from dlu_prime.naming import NAMESPACE, channel_name
from dlu_prime.runtime.delivery import CLOSED, OK, STALE, TIMEOUT, ChannelBook, check_seq, session_id

logger = logging.getLogger(__name__)

# Blocked `put`/`get` calls each hold one concurrency slot of the async actor.
MAX_CONCURRENCY = 4096

# `state=` left out: acknowledge without touching the committed state.
_UNSET: Any = object()


class ChannelError(Exception):
    """Base of every channel error."""


class ChannelNotFoundError(ChannelError, LookupError):
    """No channel actor of that name exists (never created, or destroyed)."""


class ChannelTimeoutError(ChannelError, TimeoutError):
    """A `put` found no room, or a `get` found no item, within its timeout."""


class ChannelClosed(ChannelError):
    """The channel is closed and drained (on `get`), or closed (on `put`): the stream has ended.

    Deliberately not a StopIteration, which generators would turn into RuntimeError.
    """


class ChannelUnavailableError(ChannelError):
    """The channel actor died during the call; it restarts empty (see the module docstring)."""


class _ChannelActor:
    """The channel's book (`ChannelBook`) behind an async lock: blocked puts and gets wait
    without holding the actor."""

    def __init__(self, capacity: int) -> None:
        self._book = ChannelBook(capacity)
        self._cond = asyncio.Condition()
        self._waiting_puts = 0
        self._waiting_gets = 0
        self._getters: dict[str, int] = {}  # consumer -> its gets waiting now (`watch`)

    def config(self) -> dict[str, int]:
        return {"capacity": self._book.capacity}

    async def put(
        self, items: list[Any], producer: str | None, first_seq: int | None, timeout: float | None
    ) -> tuple[str, int, int]:
        """Appends `items` in order, each as soon as there is room, dropping numbered ones that
        were accepted before; returns (status, items handled, items new)."""
        book = self._book
        done = new = 0
        try:
            async with asyncio.timeout(timeout), self._cond:
                for offset, item in enumerate(items):
                    seq = None if first_seq is None else first_seq + offset
                    self._waiting_puts += 1
                    try:
                        # A re-send is dropped even when the channel is full or closed: a
                        # restarted producer may replay into a stream it already ended.
                        await self._cond.wait_for(
                            lambda: book.duplicate(producer, seq) or book.closed or book.has_room()  # noqa: B023
                        )
                    finally:
                        self._waiting_puts -= 1
                    if book.duplicate(producer, seq):
                        book.drop()
                        done += 1
                        continue
                    if book.closed:
                        return CLOSED, done, new
                    book.append(item, producer, seq)
                    done += 1
                    new += 1
                    self._cond.notify_all()
        except TimeoutError:
            return TIMEOUT, done, new
        return OK, done, new

    def next_seq(self, producer: str) -> int:
        return self._book.next_seq(producer)

    async def get(
        self, consumer: str, session: str, state: Any, commit: bool, timeout: float | None
    ) -> tuple[str, Any]:
        """Acknowledges the session's lease (with its state), then leases the next item."""
        book = self._book
        async with self._cond:
            self._begin(consumer, session, state, commit)

            def ready() -> bool:
                return book.ready(consumer) or not book.current(consumer, session)

            self._waiting_gets += 1
            self._getters[consumer] = self._getters.get(consumer, 0) + 1
            try:
                async with asyncio.timeout(timeout):
                    await self._cond.wait_for(ready)
            except TimeoutError:
                return TIMEOUT, None
            finally:
                self._waiting_gets -= 1
                left = self._getters.pop(consumer) - 1
                if left:
                    self._getters[consumer] = left
            if not book.current(consumer, session):
                return STALE, None
            status, item = book.take(consumer)
            self._cond.notify_all()
            return status, item

    async def ack(self, consumer: str, session: str, state: Any, commit: bool) -> int:
        async with self._cond:
            return self._begin(consumer, session, state, commit)

    def _begin(self, consumer: str, session: str, state: Any, commit: bool) -> int:
        """A call from a new session (a restart) gets its leases back and acknowledges nothing;
        one from the current session acknowledges them, with the state."""
        if self._book.enter(consumer, session):
            self._cond.notify_all()  # a get the dead session left waiting ends STALE
            return 0
        return self._book.settle(consumer, session, state, commit=commit)

    async def restore(self, consumer: str, session: str) -> Any:
        async with self._cond:
            if self._book.enter(consumer, session):
                self._cond.notify_all()
            return self._book.readers[consumer].state

    async def close(self) -> None:
        async with self._cond:
            self._book.closed = True
            self._cond.notify_all()

    def stats(self) -> dict[str, int | bool]:
        return {**self._book.stats(), "waiting_puts": self._waiting_puts, "waiting_gets": self._waiting_gets}

    def watch(self) -> dict[str, Any]:
        """`stats` and the consumers waiting in a `get` now: what the PrimeMaster's stall check
        names when nothing moves."""
        return {**self.stats(), "getters": sorted(self._getters)}


_RemoteChannelActor = ray.remote(_ChannelActor)


class DataChannel:
    """Picklable handle to one channel; pass it to other actors as an argument.

    One consumer id is one sequential reader: its `get` acknowledges its previous item.
    For large payloads, put `ray.put(...)` references as items so the actor holds only refs.
    """

    def __init__(self, job: str, name: str, actor: Any) -> None:
        self.job = job
        self.name = name
        self._actor: Any = actor  # a Ray ActorHandle (untyped remote methods)

    def __repr__(self) -> str:
        return f"DataChannel(job={self.job!r}, name={self.name!r})"

    @property
    def ray_name(self) -> str:
        """The actor's name in the `dlu` namespace."""
        return channel_name(self.job, self.name)

    @classmethod
    def create(cls, job: str, name: str, capacity: int = 1024) -> DataChannel:
        """Creates the channel actor, or adopts the existing one of that name (same capacity)."""
        _check_names(job, name)
        if isinstance(capacity, bool) or not isinstance(capacity, int) or capacity < 1:  # pyright: ignore[reportUnnecessaryIsInstance]
            raise ValueError(f"capacity must be an integer >= 1, got {capacity!r}")
        actor: Any = _RemoteChannelActor.options(
            name=channel_name(job, name),
            namespace=NAMESPACE,
            lifetime="detached",
            get_if_exists=True,
            num_cpus=0,
            max_restarts=-1,
            max_concurrency=MAX_CONCURRENCY,
        ).remote(capacity)
        channel = cls(job, name, actor)
        existing: int = channel._call(actor.config.remote())["capacity"]
        if existing != capacity:
            raise ValueError(
                f"channel {channel.ray_name!r} already exists with capacity {existing}, not {capacity}: "
                "use DataChannel.open, or destroy it first"
            )
        logger.debug("channel %s ready (capacity %d)", channel.ray_name, capacity)
        return channel

    @classmethod
    def open(cls, job: str, name: str) -> DataChannel:
        """Finds an existing channel by name."""
        _check_names(job, name)
        try:
            actor: Any = ray.get_actor(channel_name(job, name), namespace=NAMESPACE)  # pyright: ignore[reportUnknownMemberType, reportUnknownVariableType]
        except ValueError as exc:
            raise ChannelNotFoundError(
                f"no channel {channel_name(job, name)!r} in namespace {NAMESPACE!r}: "
                "create it with DataChannel.create first"
            ) from exc
        return cls(job, name, actor)

    def put(
        self, item: Any, timeout: float | None = None, *, producer: str | None = None, seq: int | None = None
    ) -> bool:
        """Appends one item, blocking while the channel is full (back-pressure).

        With `producer` and `seq` (increasing per producer) the put is idempotent: an item whose
        seq was accepted before is dropped. Returns whether the item was new.
        """
        return self.put_many([item], timeout, producer=producer, first_seq=seq) == 1

    def put_many(
        self,
        items: Iterable[Any],
        timeout: float | None = None,
        *,
        producer: str | None = None,
        first_seq: int | None = None,
    ) -> int:
        """Appends items in order in one call (numbered first_seq, first_seq + 1, ... when a
        producer is given); the timeout bounds the whole call. Returns how many were new."""
        check_seq(producer, first_seq)
        batch = list(items)
        status, done, new = cast(
            tuple[str, int, int], self._call(self._actor.put.remote(batch, producer, first_seq, timeout))
        )
        if status == TIMEOUT:
            raise ChannelTimeoutError(
                f"channel {self.ray_name!r} stayed full for {timeout} s ({done} of {len(batch)} items put)"
            )
        if status == CLOSED:
            raise ChannelClosed(f"channel {self.ray_name!r} is closed ({done} of {len(batch)} items put)")
        return new

    def next_seq(self, producer: str) -> int:
        """Where `producer` resumes: one past the highest seq accepted from it (0 if none)."""
        check_seq(producer, 0)
        return cast(int, self._call(self._actor.next_seq.remote(producer)))

    def get(self, consumer: str, timeout: float | None = None, *, state: Any = _UNSET) -> Any:
        """Acknowledges the consumer's previous item and returns (and leases) the next one.

        `state`: the consumer's state after processing everything it got so far, kept with the
        acknowledgement (see `restore`). It is sent as it is now: later changes are not.
        """
        commit = state is not _UNSET
        ref = self._actor.get.remote(consumer, session_id(), state if commit else None, commit, timeout)
        status, item = cast(tuple[str, Any], self._call(ref))
        if status == TIMEOUT:
            raise ChannelTimeoutError(f"no item on channel {self.ray_name!r} within {timeout} s")
        if status == CLOSED:
            raise ChannelClosed(f"channel {self.ray_name!r} is closed and drained")
        if status == STALE:
            raise ChannelError(
                f"consumer {consumer!r} of channel {self.ray_name!r} was taken over by another process "
                "while this get waited (one consumer id must have one reader at a time)"
            )
        return item

    def ack(self, consumer: str, *, state: Any = _UNSET) -> int:
        """Acknowledges the consumer's leased item(s) now, with its `state` if given; returns
        how many."""
        commit = state is not _UNSET
        ref = self._actor.ack.remote(consumer, session_id(), state if commit else None, commit)
        return cast(int, self._call(ref))

    def restore(self, consumer: str) -> Any:
        """The state the consumer last committed with an ack (None if never): call it first
        thing after a (re)start, and resume from it. Items acknowledged with that state are not
        delivered again; later ones are, to this consumer first."""
        return self._call(self._actor.restore.remote(consumer, session_id()))

    def iterate(self, consumer: str, timeout: float | None = None, *, state: Any = _UNSET) -> Iterator[Any]:
        """Yields items until the channel is closed and drained, acknowledging as it goes.

        `state` (a mutable object, e.g. a dict from `restore`, updated in place by the loop) is
        committed with each acknowledgement, the last one included. Leaving the loop early
        leaves the last item leased: the next `get` or `ack` acknowledges it.
        """
        while True:
            try:
                item = self.get(consumer, timeout, state=state)
            except ChannelClosed:
                return
            yield item

    def close(self) -> None:
        """Marks the end of the stream: consumers finish once the queue is drained."""
        self._call(self._actor.close.remote())

    def stats(self) -> dict[str, int | bool]:
        """Counts: queued, leased, pending, put, duplicates, delivered, acked, redelivered,
        waiting_*; closed."""
        return cast(dict[str, int | bool], self._call(self._actor.stats.remote()))

    def destroy(self) -> None:
        """Kills the actor (and its items); the name is free again."""
        ray.kill(self._actor, no_restart=True)  # pyright: ignore[reportUnknownMemberType]

    def _call(self, ref: Any) -> Any:
        try:
            return ray.get(ref)
        except RayActorError as exc:
            raise ChannelUnavailableError(f"channel {self.ray_name!r} died during the call: {exc}") from exc


def _check_names(job: str, name: str) -> None:
    for arg, value in (("job", job), ("name", name)):
        if not isinstance(value, str) or not value:  # pyright: ignore[reportUnnecessaryIsInstance]
            raise ValueError(f"{arg} must be a non-empty string, got {value!r}")
