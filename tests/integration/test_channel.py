"""DataChannel on a real Ray: order, back-pressure, timeouts, close, several consumers, and a
consumer actor killed while holding an item (nothing lost)."""

from __future__ import annotations

import os
import pickle
import sys
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any, cast

import pytest
import ray
from ray import cloudpickle
from ray.exceptions import RayActorError

from dlu_prime.naming import NAMESPACE, job_prefix
from dlu_prime.runtime.data_channel import (
    ChannelClosed,
    ChannelNotFoundError,
    ChannelTimeoutError,
    DataChannel,
)

pytestmark = [pytest.mark.ray, pytest.mark.timeout(60)]
# pytest-timeout's SIGALRM does not interrupt a blocking ray.get: every wait below has its own timeout.

# Test modules are not importable inside Ray workers: ship the actor classes by value.
cloudpickle.register_pickle_by_value(sys.modules[__name__])

MakeChannel = Callable[..., DataChannel]


class Consumer:
    """A self-loop worker. Like the worker runtime, every incarnation recovers first (a no-op
    on the first start)."""

    def __init__(self, channel: DataChannel, consumer: str) -> None:
        self.channel = channel
        self.consumer = consumer
        self.recovered = channel.recover(consumer)

    def ready(self) -> tuple[int, int]:
        """(pid of this incarnation, items it recovered)."""
        return os.getpid(), self.recovered

    def take(self, sink: DataChannel) -> Any:
        """Gets one item and processes it (into `sink`), keeping it leased."""
        item = self.channel.get(self.consumer)
        sink.put(item)
        return item

    def drain(self, sink: DataChannel | None = None, delay: float = 0.0) -> list[Any]:
        out: list[Any] = []
        for item in self.channel.iterate(self.consumer):
            time.sleep(delay)
            if sink is not None:
                sink.put(item)
            out.append(item)
        return out


class Producer:
    def __init__(self) -> None:
        self.count = 0

    def run(self, channel: DataChannel, n: int) -> int:
        for i in range(n):
            channel.put(i)
            self.count += 1
        channel.close()
        return self.count

    def puts(self) -> int:
        return self.count


RemoteConsumer: Any = ray.remote(num_cpus=0)(Consumer)
RemoteProducer: Any = ray.remote(num_cpus=0)(Producer)


def _wait_for(predicate: Callable[[], bool], what: str, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def _kill_and_wait_restart(actor: Any, old_pid: int) -> int:
    """Kills the actor (Ray restarts it); returns what the new incarnation recovered."""
    ray.kill(actor, no_restart=False)
    deadline = time.monotonic() + 30
    while True:
        assert time.monotonic() < deadline, "actor did not restart"
        try:
            pid, recovered = ray.get(actor.ready.remote(), timeout=30)
        except RayActorError:
            pid, recovered = old_pid, 0
        if pid != old_pid:  # a call may still reach the dying incarnation
            return recovered
        time.sleep(0.05)


def _job_actors(job: str) -> list[str]:
    names = cast(list[dict[str, str]], ray.util.list_named_actors(all_namespaces=True))
    return [n["name"] for n in names if n["namespace"] == NAMESPACE and n["name"].startswith(job_prefix(job))]


@pytest.fixture
def job(ray_session: Any) -> Iterator[str]:
    name = f"chan-{uuid.uuid4().hex[:8]}"
    yield name
    _wait_for(lambda: not _job_actors(name), f"actors of job {name} to be gone", timeout=10)


@pytest.fixture
def make_channel(job: str) -> Iterator[MakeChannel]:
    """Creates channels of the test's job and destroys them afterwards."""
    made: list[DataChannel] = []

    def make(name: str = "c", capacity: int = 1024) -> DataChannel:
        made.append(DataChannel.create(job, name, capacity))
        return made[-1]

    yield make
    for channel in made:
        channel.destroy()


def test_fifo_close_and_adopt(job: str, make_channel: MakeChannel) -> None:
    channel = make_channel(capacity=100)
    assert channel.put_many(range(50)) == 50
    channel.put("last")
    assert [channel.get("a") for _ in range(3)] == [0, 1, 2]
    stats = channel.stats()
    assert (stats["queued"], stats["leased"], stats["put"], stats["acked"]) == (48, 1, 51, 2)
    assert channel.ack("a") == 1

    # Creating it again adopts the same actor; a different capacity is refused.
    again = DataChannel.create(job, "c", capacity=100)
    assert again.stats()["queued"] == 48
    with pytest.raises(ValueError, match="capacity"):
        DataChannel.create(job, "c", capacity=5)
    assert DataChannel.open(job, "c").stats()["queued"] == 48

    channel.close()
    assert list(channel.iterate("a", timeout=10)) == [*range(3, 50), "last"]
    stats = channel.stats()
    assert (stats["queued"], stats["leased"], stats["acked"], stats["closed"]) == (0, 0, 51, True)
    with pytest.raises(ChannelClosed):
        channel.get("b")
    with pytest.raises(ChannelClosed):
        channel.put("late")


def test_a_put_into_a_full_channel_waits_for_room(make_channel: MakeChannel) -> None:
    channel = make_channel(capacity=1)
    channel.put(0)
    with ThreadPoolExecutor(1) as pool:
        pending = pool.submit(channel.put, 1, timeout=120.0)
        _wait_for(lambda: channel.stats()["waiting_puts"] == 1, "the put to wait in the full channel", 30.0)
        assert not pending.done()
        assert channel.get("a", timeout=10) == 0  # room: the waiting put goes in
        pending.result(timeout=30)
    assert channel.get("a", timeout=10) == 1


def test_timeouts(make_channel: MakeChannel) -> None:
    channel = make_channel(capacity=1)
    channel.put(0)
    with pytest.raises(ChannelTimeoutError, match="full"):
        channel.put(1, timeout=0.2)
    assert channel.get("a", timeout=0.2) == 0
    with pytest.raises(ChannelTimeoutError):
        channel.get("a", timeout=0.2)
    stats = channel.stats()
    # The timed-out get still acknowledged item 0; the timed-out put added nothing.
    assert (stats["put"], stats["acked"], stats["leased"], stats["waiting_puts"]) == (1, 1, 0, 0)
    with pytest.raises(TimeoutError):  # ChannelTimeoutError is a TimeoutError
        channel.get("a", timeout=0.05)


def test_bad_input_missing_channel_and_pickling(job: str, make_channel: MakeChannel) -> None:
    with pytest.raises(ValueError, match="capacity"):
        DataChannel.create(job, "c", capacity=0)
    with pytest.raises(ValueError, match="name"):
        DataChannel.create(job, "", capacity=1)
    with pytest.raises(ChannelNotFoundError, match=f"{job}.channel.missing") as err:
        DataChannel.open(job, "missing")
    assert isinstance(err.value, LookupError)

    channel = make_channel()
    copy = pickle.loads(pickle.dumps(channel))
    assert (copy.job, copy.name) == (job, "c")
    copy.put("via copy")
    assert channel.get("a") == "via copy"


def test_back_pressure(make_channel: MakeChannel) -> None:
    capacity, n = 2, 12
    channel = make_channel(capacity=capacity)
    producer = RemoteProducer.options(max_concurrency=2).remote()  # puts() answers while run() blocks
    done = producer.run.remote(channel, n)
    _wait_for(lambda: channel.stats()["waiting_puts"] == 1, "the producer to block on a full channel")

    def puts() -> int:
        return ray.get(producer.puts.remote(), timeout=30)

    assert puts() == capacity
    consumed: list[int] = []
    for item in channel.iterate("slow", timeout=10):
        consumed.append(item)
        assert puts() <= len(consumed) + capacity
        time.sleep(0.02)
    assert consumed == list(range(n))
    assert ray.get(done, timeout=30) == n
    ray.kill(producer)


def test_consumers_get_disjoint_items(job: str, make_channel: MakeChannel) -> None:
    channel = make_channel(capacity=8)
    # The channel handle is pickled into each actor.
    consumers = [RemoteConsumer.remote(channel, f"{job}.worker.{rank}") for rank in range(3)]
    ray.get([c.ready.remote() for c in consumers], timeout=30)
    drains = [c.drain.remote(None, 0.005) for c in consumers]
    channel.put_many(range(90), timeout=30)
    channel.close()
    results: list[list[int]] = ray.get(drains, timeout=30)

    everything = [item for got in results for item in got]
    assert sorted(everything) == list(range(90)), "an item was lost or delivered twice"
    assert all(got == sorted(got) for got in results), "each consumer sees FIFO order"
    assert channel.stats()["acked"] == 90
    for c in consumers:
        ray.kill(c)


def test_restarted_consumer_loses_nothing(job: str, make_channel: MakeChannel) -> None:
    channel = make_channel(capacity=16)
    sink = make_channel("sink")  # what the consumer processed, across its incarnations
    consumer_id = f"{job}.worker.0"
    consumer = RemoteConsumer.options(max_restarts=2).remote(channel, consumer_id)
    pid, recovered = ray.get(consumer.ready.remote(), timeout=30)
    assert recovered == 0

    # 1. Killed while its get waits on an empty channel: that get must not swallow a later item.
    waiting = consumer.take.remote(sink)
    _wait_for(lambda: channel.stats()["waiting_gets"] == 1, "the consumer to wait for an item")
    assert _kill_and_wait_restart(consumer, pid) == 0
    with pytest.raises(RayActorError):
        ray.get(waiting, timeout=30)
    channel.put_many(range(10))

    # 2. Killed while holding (and having processed) item 0, before acknowledging it.
    assert ray.get(consumer.take.remote(sink), timeout=30) == 0
    assert channel.stats()["leased"] == 1
    pid, _ = ray.get(consumer.ready.remote(), timeout=30)
    assert _kill_and_wait_restart(consumer, pid) == 1, "the restarted consumer re-queues its leased item"

    channel.close()
    assert ray.get(consumer.drain.remote(sink), timeout=30) == list(range(10))
    sink.close()
    processed = Counter(sink.iterate("check", timeout=10))
    assert set(processed) == set(range(10)), "an item was lost"
    assert processed[0] == 2 and all(processed[i] == 1 for i in range(1, 10)), "at-least-once"
    stats = channel.stats()
    assert (stats["acked"], stats["leased"], stats["queued"], stats["redelivered"]) == (10, 0, 0, 1)
    ray.kill(consumer)
