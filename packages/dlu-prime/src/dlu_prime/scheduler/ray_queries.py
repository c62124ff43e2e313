"""Questions the scheduler asks Ray and the job's shard queues, outside any actor's lifecycle."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

import ray
from ray.exceptions import GetTimeoutError, RayError

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


def node_of(name: str, handle: Callable[[str], Any]) -> dict[str, str]:
    """{name: its node} as the live actor says (asked briefly; empty where it cannot answer)."""
    try:
        identity: dict[str, Any] = ray.get(handle(name).identity.remote(), timeout=2.0)
    except (RayError, GetTimeoutError, ValueError):
        return {}
    node = identity.get("node_id")
    return {name: str(node)} if node else {}


def reconstructed_fresh(handle: Any) -> bool:
    """Ray already rebuilt this actor and nothing ran in it yet: set it up, do not replace it."""
    try:
        status: dict[str, Any] = ray.get(handle.status.remote(), timeout=5.0)
    except (RayError, GetTimeoutError, ValueError):
        return False
    return bool(status.get("reconstructed")) and status.get("stage") == "INIT"
