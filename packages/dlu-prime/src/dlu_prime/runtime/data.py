"""Data channels and shard queues as seen from user code: created through the PrimeMaster
(which records them in the job's state and removes them when the job ends), consumed under
the worker's stable name so a restarted worker gets back what it was holding."""

from __future__ import annotations

import logging
from typing import Any

from dlu_prime.naming import NAMESPACE, SEP, master_name
from dlu_prime.runtime.context import current_worker
from dlu_prime.runtime.data_channel import DataChannel
from dlu_prime.runtime.sharding import ShardQueue

logger = logging.getLogger(__name__)


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
    """This worker's name as a consumer: stable across restarts of its actor."""
    return current_worker().actor_name


def recover_data(job: str, consumer: str) -> int:
    """Give back what a restarted worker held: leased channel items and shards in progress."""
    from dlu_prime.scheduler.cleanup import job_actor_names

    returned = 0
    for actor in job_actor_names(job):
        parts = actor.split(SEP)
        if len(parts) != 3:
            continue
        _, kind, name = parts
        try:
            if kind == "channel":
                returned += DataChannel.open(job, name).recover(consumer)
            elif kind == "shards":
                returned += len(ShardQueue.open(job, name).requeue(consumer))
        except Exception:
            logger.warning("could not recover %s %s for %s", kind, name, consumer, exc_info=True)
    if returned:
        logger.info("%s: %d item(s)/shard(s) returned after restart", consumer, returned)
    return returned
