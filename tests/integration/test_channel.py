"""DataChannel on a real Ray: order, back-pressure, timeouts, close, several consumers, a
consumer actor killed while waiting and while holding an item, and a producer killed while
blocked on a full channel (every item processed exactly once)."""

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
    """A stateful self-loop worker, as the SDK's pattern has it: every incarnation restores its
    state first; its output is numbered by that state; each get commits the state."""

    def __init__(self, channel: DataChannel, consumer: str) -> None:
        self.channel = channel
        self.consumer = consumer
        self.state: dict[str, int] = channel.restore(consumer) or {"sent": 0}

    def ready(self) -> tuple[int, dict[str, int]]:
        """(pid of this incarnation, the state it restored)."""
        return os.getpid(), dict(self.state)

    def _emit(self, sink: DataChannel | None, item: Any) -> None:
        if sink is not None:
            sink.put(item, producer=self.consumer, seq=self.state["sent"])
        self.state["sent"] += 1

    def take(self, sink: DataChannel) -> Any:
        """Gets one item and processes it (into `sink`), keeping it leased."""
        item = self.channel.get(self.consumer, state=self.state)
        self._emit(sink, item)
        return item

    def drain(self, sink: DataChannel | None = None, delay: float = 0.0) -> list[Any]:
        out: list[Any] = []
        for item in self.channel.iterate(self.consumer, state=self.state):
            time.sleep(delay)
            self._emit(sink, item)
            out.append(item)
        return out


class Producer:
    def __init__(self) -> None:
        self.count = 0

    def run(self, channel: DataChannel, n: int, producer: str | None = None) -> int:
        """Puts 0..n-1 and closes; a named producer resumes where the channel says it was."""
        start = channel.next_seq(producer) if producer else 0
        for i in range(start, n):
            channel.put(i, producer=producer, seq=i if producer else None)
            self.count += 1
        channel.close()
        return self.count

    def puts(self) -> int:
        return self.count

    def pid(self) -> int:
        return os.getpid()


RemoteConsumer: Any = ray.remote(num_cpus=0)(Consumer)
RemoteProducer: Any = ray.remote(num_cpus=0)(Producer)


def _wait_for(predicate: Callable[[], bool], what: str, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def _kill_and_wait_restart(actor: Any, old_pid: int) -> dict[str, int]:
    """Kills the actor (Ray restarts it); returns the state its new incarnation restored."""
    ray.kill(actor, no_restart=False)
    deadline = time.monotonic() + 30
    while True:
        assert time.monotonic() < deadline, "actor did not restart"
        try:
            pid, state = ray.get(actor.ready.remote(), timeout=30)
        except RayActorError:
            pid, state = old_pid, {}
        if pid != old_pid:  # a call may still reach the dying incarnation
            return state
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


def test_restarted_consumer_processes_every_item_exactly_once(job: str, make_channel: MakeChannel) -> None:
    channel = make_channel(capacity=16)
    sink = make_channel("sink")  # what the consumer processed, across its incarnations
    consumer_id = f"{job}.worker.0"
    consumer = RemoteConsumer.options(max_restarts=2).remote(channel, consumer_id)
    pid, state = ray.get(consumer.ready.remote(), timeout=30)
    assert state == {"sent": 0}

    # 1. Killed while its get waits on an empty channel: that get must not swallow a later item.
    waiting = consumer.take.remote(sink)
    _wait_for(lambda: channel.stats()["waiting_gets"] == 1, "the consumer to wait for an item")
    assert _kill_and_wait_restart(consumer, pid) == {"sent": 0}
    with pytest.raises(RayActorError):
        ray.get(waiting, timeout=30)
    _wait_for(lambda: channel.stats()["waiting_gets"] == 0, "the dead incarnation's get to end")
    channel.put_many(range(10))

    # 2. Killed while holding item 1, processed (its output sent) but not acknowledged.
    assert ray.get(consumer.take.remote(sink), timeout=30) == 0
    assert ray.get(consumer.take.remote(sink), timeout=30) == 1
    assert channel.stats()["leased"] == 1
    pid, _ = ray.get(consumer.ready.remote(), timeout=30)
    assert _kill_and_wait_restart(consumer, pid) == {"sent": 1}, "the state committed with item 0"
    assert (channel.stats()["pending"], channel.stats()["leased"]) == (1, 0)

    channel.close()
    assert ray.get(consumer.drain.remote(sink), timeout=30) == list(range(1, 10)), "item 1 again, first"
    sink.close()
    processed = Counter(sink.iterate("check", timeout=10))
    assert processed == Counter(range(10)), "each item processed into the sink exactly once"
    assert sink.stats()["duplicates"] == 1, "the re-sent output of item 1 was dropped"
    stats = channel.stats()
    assert (stats["acked"], stats["leased"], stats["queued"], stats["redelivered"]) == (10, 0, 0, 1)
    ray.kill(consumer)


def test_restarted_producer_resumes_and_replays_harmlessly(job: str, make_channel: MakeChannel) -> None:
    channel = make_channel(capacity=3)
    me = f"{job}.source.0"
    producer = RemoteProducer.options(max_restarts=1, max_concurrency=2).remote()
    pid = ray.get(producer.pid.remote(), timeout=30)
    producer.run.remote(channel, 20, me)
    _wait_for(lambda: channel.stats()["waiting_puts"] == 1, "the producer to block on a full channel")
    got = [channel.get("c", timeout=10) for _ in range(2)]
    _wait_for(lambda: channel.stats()["waiting_puts"] == 1, "the producer to block again")
    ray.kill(producer, no_restart=False)  # dies with a put waiting inside the channel
    _wait_for(lambda: _pid(producer) not in (None, pid), "the producer to restart", timeout=30)
    done = producer.run.remote(channel, 20, me)
    got += list(channel.iterate("c", timeout=10))
    assert got == list(range(20)), "nothing lost, nothing twice, in order"
    assert ray.get(done, timeout=30) < 20, "the new incarnation resumed, it did not start over"
    # A replay of the whole stream into the closed channel is dropped, not refused.
    assert channel.put_many(range(20), producer=me, first_seq=0) == 0
    assert channel.put(99, producer=me, seq=3) is False
    with pytest.raises(ChannelClosed):
        channel.put(20, producer=me, seq=20)
    with pytest.raises(ValueError, match="producer and seq"):
        channel.put(1, seq=1)
    ray.kill(producer)


def _pid(actor: Any) -> int | None:
    try:
        return ray.get(actor.pid.remote(), timeout=5)
    except ray.exceptions.RayError:
        return None
