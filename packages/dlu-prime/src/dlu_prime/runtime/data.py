"""Data channels and shard queues as seen from user code: created through the PrimeMaster
(which records them in the job's state and removes them when the job ends), used under the
worker's stable name so a restarted worker gets back what it was holding: the channel or queue
sees a call from a new process under that name and gives it back (no recovery call needed)."""

from __future__ import annotations

from typing import Any

from dlu_prime.naming import NAMESPACE, master_name
from dlu_prime.runtime.context import current_worker
from dlu_prime.runtime.data_channel import DataChannel
from dlu_prime.runtime.sharding import ShardQueue


def _master() -> Any:
    import ray

    return ray.get_actor(master_name(current_worker().job), namespace=NAMESPACE)


def channel(name: str, capacity: int = 1024) -> DataChannel:
    """The job's data channel `name`, created on first use (every caller must agree on capacity)."""
    import ray

    return ray.get(_master().create_channel.remote(name, capacity))


def shard_queue(name: str, dataset_size: int, shard_size: int, **options: Any) -> ShardQueue:
    """The job's shard queue `name` over `dataset_size` records, created on first use."""
    import ray

    return ray.get(
        _master().create_shard_queue.remote(name, dataset_size=dataset_size, shard_size=shard_size, **options)
    )


def consumer_id() -> str:
    """This worker's name as a consumer (and producer, for `seq`-numbered puts): stable across
    restarts of its actor and of the whole job."""
    return current_worker().actor_name
