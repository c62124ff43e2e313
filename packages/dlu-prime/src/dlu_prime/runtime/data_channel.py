"""Bounded data channels between roles (the worker self-loop's pipes).

A channel is one detached, named async Ray actor per (job, channel). Producers block while it is
full (back-pressure). Each item handed to a consumer is *leased* until that consumer's next `get`
(ack-on-next-get) or an explicit `ack`, so a consumer that dies mid-item loses nothing: its
restarted incarnation (same stable consumer id, e.g. "job.role.rank") calls `recover`, which puts
the leased item(s) back at the front of the queue. Delivery is therefore at-least-once.
`recover` also voids a `get` that the dead incarnation left waiting in the actor, which would
otherwise lease an item that the new incarnation's next `get` acknowledges unprocessed.

`capacity` bounds the queued (not yet delivered) items; leased items come on top, one per
consumer, and re-queued ones may briefly exceed it (a recovery never blocks).

Caveat: the actor keeps its state in memory. It is restarted by Ray (`max_restarts=-1`) if its
process dies, but it comes back empty and open: queued and leased items are lost, and a consumer
waiting for more blocks until its timeout. Calls in flight at that moment raise
`ChannelUnavailableError`. The PrimeMaster owns channels and records them in its state.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Iterable, Iterator
from typing import Any, cast

import ray
from ray.exceptions import RayActorError

from dlu_prime.naming import NAMESPACE, channel_name

logger = logging.getLogger(__name__)

# Blocked `put`/`get` calls each hold one concurrency slot of the async actor.
MAX_CONCURRENCY = 4096

_OK = "ok"
_CLOSED = "closed"
_TIMEOUT = "timeout"
_STALE = "stale"


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
    """The channel's state. Async, so blocked puts and gets wait without holding the actor."""

    def __init__(self, capacity: int) -> None:
        self._capacity = capacity
        self._queue: deque[Any] = deque()
        self._leases: dict[str, list[Any]] = {}
        # Bumped by `recover`: a get still waiting for a consumer's dead incarnation must not
        # lease an item that the new incarnation's next get would then acknowledge unprocessed.
        self._generation: dict[str, int] = {}
        self._closed = False
        self._cond = asyncio.Condition()
        self._counts = {"put": 0, "delivered": 0, "acked": 0, "redelivered": 0}
        self._waiting_puts = 0
        self._waiting_gets = 0

    def config(self) -> dict[str, int]:
        return {"capacity": self._capacity}

    async def put(self, items: list[Any], timeout: float | None) -> tuple[str, int]:
        """Appends `items` in order, each as soon as there is room; returns (status, how many)."""
        done = 0
        try:
            async with asyncio.timeout(timeout), self._cond:
                for item in items:
                    self._waiting_puts += 1
                    try:
                        await self._cond.wait_for(lambda: self._closed or len(self._queue) < self._capacity)
                    finally:
                        self._waiting_puts -= 1
                    if self._closed:
                        return _CLOSED, done
                    self._queue.append(item)
                    done += 1
                    self._counts["put"] += 1
                    self._cond.notify_all()
        except TimeoutError:
            return _TIMEOUT, done
        return _OK, done

    async def get(self, consumer: str, timeout: float | None) -> tuple[str, Any]:
        """Acknowledges the consumer's lease, then leases it the next item (status, item)."""
        async with self._cond:
            self._ack(consumer)
            generation = self._generation.get(consumer, 0)

            def ready() -> bool:
                return bool(self._queue) or self._closed or self._generation.get(consumer, 0) != generation

            self._waiting_gets += 1
            try:
                async with asyncio.timeout(timeout):
                    await self._cond.wait_for(ready)
            except TimeoutError:
                return _TIMEOUT, None
            finally:
                self._waiting_gets -= 1
            if self._generation.get(consumer, 0) != generation:
                return _STALE, None
            if not self._queue:
                return _CLOSED, None
            item = self._queue.popleft()
            self._leases.setdefault(consumer, []).append(item)
            self._counts["delivered"] += 1
            self._cond.notify_all()
            return _OK, item

    async def ack(self, consumer: str) -> int:
        async with self._cond:
            return self._ack(consumer)

    def _ack(self, consumer: str) -> int:
        acked = len(self._leases.pop(consumer, ()))
        self._counts["acked"] += acked
        return acked

    async def recover(self, consumer: str) -> int:
        """Re-queues the consumer's leased items at the front, in their original order."""
        async with self._cond:
            self._generation[consumer] = self._generation.get(consumer, 0) + 1
            items = self._leases.pop(consumer, [])
            self._queue.extendleft(reversed(items))
            self._counts["redelivered"] += len(items)
            self._cond.notify_all()
            return len(items)

    async def close(self) -> None:
        async with self._cond:
            self._closed = True
            self._cond.notify_all()

    def stats(self) -> dict[str, int | bool]:
        return {
            "capacity": self._capacity,
            "queued": len(self._queue),
            "leased": sum(len(items) for items in self._leases.values()),
            **self._counts,
            "waiting_puts": self._waiting_puts,
            "waiting_gets": self._waiting_gets,
            "closed": self._closed,
        }


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

    def put(self, item: Any, timeout: float | None = None) -> None:
        """Appends one item, blocking while the channel is full (back-pressure)."""
        self.put_many([item], timeout)

    def put_many(self, items: Iterable[Any], timeout: float | None = None) -> int:
        """Appends items in order in one call; the timeout bounds the whole call."""
        batch = list(items)
        status, done = cast(tuple[str, int], self._call(self._actor.put.remote(batch, timeout)))
        if status == _TIMEOUT:
            raise ChannelTimeoutError(
                f"channel {self.ray_name!r} stayed full for {timeout} s ({done} of {len(batch)} items put)"
            )
        if status == _CLOSED:
            raise ChannelClosed(f"channel {self.ray_name!r} is closed ({done} of {len(batch)} items put)")
        return done

    def get(self, consumer: str, timeout: float | None = None) -> Any:
        """Acknowledges the consumer's previous item and returns (and leases) the next one."""
        status, item = cast(tuple[str, Any], self._call(self._actor.get.remote(consumer, timeout)))
        if status == _TIMEOUT:
            raise ChannelTimeoutError(f"no item on channel {self.ray_name!r} within {timeout} s")
        if status == _CLOSED:
            raise ChannelClosed(f"channel {self.ray_name!r} is closed and drained")
        if status == _STALE:
            raise ChannelError(
                f"consumer {consumer!r} of channel {self.ray_name!r} was recovered while this get waited "
                "(one consumer id must have one reader at a time)"
            )
        return item

    def ack(self, consumer: str) -> int:
        """Acknowledges the consumer's leased item(s) now; returns how many."""
        return cast(int, self._call(self._actor.ack.remote(consumer)))

    def iterate(self, consumer: str, timeout: float | None = None) -> Iterator[Any]:
        """Yields items until the channel is closed and drained, acknowledging as it goes.

        Leaving the loop early leaves the last item leased: the next `get` acknowledges it,
        `recover` re-delivers it.
        """
        while True:
            try:
                item = self.get(consumer, timeout)
            except ChannelClosed:
                return
            yield item

    def recover(self, consumer: str) -> int:
        """Puts the consumer's unacknowledged items back at the front; call it when a worker
        (re)starts. Returns how many items were re-queued."""
        recovered = cast(int, self._call(self._actor.recover.remote(consumer)))
        if recovered:
            logger.info("channel %s: re-queued %d item(s) of consumer %s", self.ray_name, recovered, consumer)
        return recovered

    def close(self) -> None:
        """Marks the end of the stream: consumers finish once the queue is drained."""
        self._call(self._actor.close.remote())

    def stats(self) -> dict[str, int | bool]:
        """Counts: queued, leased, put, delivered, acked, redelivered, waiting_*; closed."""
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
