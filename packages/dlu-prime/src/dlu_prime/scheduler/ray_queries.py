"""Questions the scheduler asks Ray and the job's shard queues, outside any actor's lifecycle."""

from __future__ import annotations

import logging
from collections.abc import Sequence

import ray
from ray.exceptions import RayError

logger = logging.getLogger(__name__)


def requeue_shards(job: str, queues: Sequence[str], workers: Sequence[str]) -> dict[str, list[int]]:
    """Hand the shards these stopped workers held back to each queue's todo; queue -> ids."""
    from dlu_prime.runtime.sharding import ShardQueue

    out: dict[str, list[int]] = {}
    for name in queues:
        queue = ShardQueue.open(job, name)
        ids = [shard for worker in workers for shard in queue.requeue(worker)]
        if ids:
            out[name] = ids
    return out


def dead_nodes(node_ids: Sequence[str]) -> set[str]:
    """Which of these nodes Ray has marked dead (none when Ray cannot be asked)."""
    wanted = set(node_ids)
    try:
        nodes = ray.nodes()
    except RayError as exc:
        logger.warning("could not list Ray's nodes: %s", exc)
        return set()
    return {str(n["NodeID"]) for n in nodes if str(n.get("NodeID")) in wanted and not n.get("Alive")}
