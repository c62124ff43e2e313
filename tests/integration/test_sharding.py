"""ShardQueue on a real Ray: ranges, order, deterministic shuffle, and three worker actors over
two epochs with one killed while holding shards (every shard completed exactly once)."""

from __future__ import annotations

import os
import sys
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any, cast

import pytest
import ray
from ray import cloudpickle

from dlu_prime.naming import NAMESPACE, job_prefix
from dlu_prime.runtime.sharding import Shard, ShardQueue, ShardQueueNotFoundError

pytestmark = [pytest.mark.ray, pytest.mark.timeout(60)]
# pytest-timeout's SIGALRM does not interrupt a blocking ray.get: every wait below has its own timeout.

# Test modules are not importable inside Ray workers: ship the actor classes by value.
cloudpickle.register_pickle_by_value(sys.modules[__name__])

MakeQueue = Callable[..., ShardQueue]


class ShardWorker:
    def __init__(self, queue: ShardQueue, worker: str) -> None:
        self.queue = queue
        self.worker = worker

    def ready(self) -> int:
        return os.getpid()

    def take(self, n: int) -> list[int]:
        """Takes n shards and sits on them (this worker is about to die)."""
        shards = [self.queue.next_shard(self.worker) for _ in range(n)]
        return [s.id for s in shards if s is not None]

    def run(self, delay: float) -> tuple[list[int], list[int]]:
        """The self-loop: returns (ids handed to it, ids it completed). Polls while the only
        shards left are held by others, since those may come back through `requeue`."""
        handed: list[int] = []
        completed: list[int] = []
        while True:
            shard = self.queue.next_shard(self.worker)
            if shard is None:
                if self.queue.finished():
                    return handed, completed
                time.sleep(0.02)
                continue
            handed.append(shard.id)
            time.sleep(delay)
            if self.queue.complete(self.worker, shard.id):
                completed.append(shard.id)


RemoteShardWorker: Any = ray.remote(num_cpus=0)(ShardWorker)


def _job_actors(job: str) -> list[str]:
    names = cast(list[dict[str, str]], ray.util.list_named_actors(all_namespaces=True))
    return [n["name"] for n in names if n["namespace"] == NAMESPACE and n["name"].startswith(job_prefix(job))]


@pytest.fixture
def job(ray_session: Any) -> Iterator[str]:
    name = f"shard-{uuid.uuid4().hex[:8]}"
    yield name
    deadline = time.monotonic() + 10
    while _job_actors(name):
        assert time.monotonic() < deadline, f"actors of job {name} leaked: {_job_actors(name)}"
        time.sleep(0.02)


@pytest.fixture
def make_queue(job: str) -> Iterator[MakeQueue]:
    """Creates queues of the test's job and destroys them afterwards."""
    made: list[ShardQueue] = []

    def make(name: str, **kwargs: Any) -> ShardQueue:
        made.append(ShardQueue.create(job, name, **kwargs))
        return made[-1]

    yield make
    for queue in made:
        queue.destroy()


def _drain(queue: ShardQueue, worker: str = "w") -> list[Shard]:
    shards: list[Shard] = []
    while (shard := queue.next_shard(worker)) is not None:
        shards.append(shard)
        assert queue.complete(worker, shard.id)
    return shards


@pytest.mark.parametrize(
    ("kwargs", "arg"),
    [
        ({"dataset_size": 0, "shard_size": 1}, "dataset_size"),
        ({"dataset_size": 10, "shard_size": -1}, "shard_size"),
        ({"dataset_size": 10, "shard_size": 1, "num_epochs": 0}, "num_epochs"),
        ({"dataset_size": 10, "shard_size": True}, "shard_size"),
        ({"dataset_size": 10, "shard_size": 1, "seed": "7"}, "seed"),
    ],
)
def test_bad_arguments_are_refused(job: str, kwargs: dict[str, Any], arg: str) -> None:
    with pytest.raises(ValueError, match=arg):
        ShardQueue.create(job, "q", **kwargs)


def test_missing_queue(job: str) -> None:
    with pytest.raises(ShardQueueNotFoundError, match=f"{job}.shards.missing") as err:
        ShardQueue.open(job, "missing")
    assert isinstance(err.value, LookupError)


def test_ranges_order_completion_and_requeue(job: str, make_queue: MakeQueue) -> None:
    queue = make_queue("plain", dataset_size=10, shard_size=3, num_epochs=2)
    assert queue.progress() == {"todo": 8, "doing": 0, "done": 0, "total": 8, "epoch": 0, "num_epochs": 2}
    first, second = queue.next_shard("a"), queue.next_shard("a")
    assert (first, second) == (Shard(0, 0, 3), Shard(1, 3, 6))
    assert queue.doing() == {0: "a", 1: "a"}

    assert queue.complete("b", 0) is False, "b does not hold shard 0"
    assert queue.complete("a", 99) is False
    assert queue.requeue("a") == [0, 1]
    assert queue.complete("a", 0) is False, "a stale completion after requeue changes nothing"
    assert queue.progress()["doing"] == 0

    # Re-queued shards come back first, in order; ids stay unique across epochs.
    assert _drain(queue, "b") == [
        Shard(0, 0, 3), Shard(1, 3, 6), Shard(2, 6, 9), Shard(3, 9, 10),
        Shard(4, 0, 3), Shard(5, 3, 6), Shard(6, 6, 9), Shard(7, 9, 10),
    ]  # fmt: skip
    assert queue.complete("b", 7) is False, "already done"
    assert queue.finished()
    assert queue.progress() == {"todo": 0, "doing": 0, "done": 8, "total": 8, "epoch": 1, "num_epochs": 2}

    # Creating it again adopts the same actor; different arguments are refused; open finds it.
    assert ShardQueue.create(job, "plain", dataset_size=10, shard_size=3, num_epochs=2).finished()
    with pytest.raises(ValueError, match="already exists"):
        ShardQueue.create(job, "plain", dataset_size=10, shard_size=4, num_epochs=2)
    assert ShardQueue.open(job, "plain").finished()


def test_shuffle_is_deterministic(make_queue: MakeQueue) -> None:
    args = {"dataset_size": 30, "shard_size": 1, "num_epochs": 2, "shuffle": True}

    def order(queue: ShardQueue) -> list[int]:
        return [s.id for s in iter(lambda: queue.next_shard("w"), None)]

    first = order(make_queue("a", seed=3, **args))
    second = order(make_queue("b", seed=3, **args))
    other = order(make_queue("c", seed=4, **args))
    assert first == second
    assert other != first
    epoch0, epoch1 = first[:30], first[30:]
    assert sorted(epoch0) == list(range(30)) and sorted(epoch1) == list(range(30, 60))
    assert epoch0 != sorted(epoch0), "shuffled"
    assert [i - 30 for i in epoch1] != epoch0, "each epoch has its own order"


def test_killed_worker_shards_are_requeued_and_done_once(job: str, make_queue: MakeQueue) -> None:
    queue = make_queue("data", dataset_size=1000, shard_size=37, num_epochs=2, shuffle=True, seed=7)
    total = queue.progress()["total"]
    assert total == 28 * 2
    names = [f"{job}.worker.{rank}" for rank in range(3)]
    workers = [RemoteShardWorker.remote(queue, name) for name in names]  # the handle pickles into actors
    ray.get([w.ready.remote() for w in workers], timeout=30)

    held = ray.get(workers[2].take.remote(3), timeout=30)
    assert queue.doing() == dict.fromkeys(held, names[2])
    runs = [w.run.remote(0.01) for w in workers[:2]]
    ray.kill(workers[2])  # dies holding 3 shards
    # What the PrimeMaster (or the worker's restarted incarnation) does on a worker failure:
    assert queue.requeue(names[2]) == held
    assert queue.complete(names[2], held[0]) is False, "a stale completion by the dead worker"

    results: list[tuple[list[int], list[int]]] = ray.get(runs, timeout=45)
    completed = [i for _, done in results for i in done]
    assert len(completed) == len(set(completed)), "a shard was completed twice"
    assert sorted(completed) == list(range(total)), "a shard was lost"
    handed = Counter([i for got, _ in results for i in got] + held)
    assert {i for i, n in handed.items() if n > 1} == set(held), (
        "only the dead worker's shards went out twice"
    )
    assert queue.finished()
    assert queue.progress() == {
        "todo": 0,
        "doing": 0,
        "done": total,
        "total": total,
        "epoch": 1,
        "num_epochs": 2,
    }
    assert queue.requeue(names[2]) == []
    for w in workers[:2]:
        ray.kill(w)


def test_restarted_worker_gets_its_shards_back_and_its_state(job: str, make_queue: MakeQueue) -> None:
    """No requeue call: the restarted process' first call under the worker id gives back what
    its dead incarnation held; the state kept with its last completion comes back too."""
    queue = make_queue("data", dataset_size=20, shard_size=5)
    name = f"{job}.worker.0"
    worker = RemoteShardWorker.options(max_restarts=1).remote(queue, name)
    pid = ray.get(worker.ready.remote(), timeout=30)
    first = queue.next_shard("other")
    assert first is not None and queue.complete("other", first.id, state={"records": 5})
    held = ray.get(worker.take.remote(2), timeout=30)
    assert queue.doing() == dict.fromkeys(held, name)
    ray.kill(worker, no_restart=False)
    deadline = time.monotonic() + 30
    while True:  # a call may still reach the dying incarnation: wait for the new process
        assert time.monotonic() < deadline, "the worker did not come back"
        try:
            if ray.get(worker.ready.remote(), timeout=30) != pid:
                break
        except ray.exceptions.RayActorError:
            pass
        time.sleep(0.05)
    assert ray.get(worker.take.remote(2), timeout=30) == held, "its own shards, first"
    assert queue.restore("other") == {"records": 5}
    assert queue.restore(name) is None
    ray.kill(worker)
