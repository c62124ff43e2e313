"""The backlog of a job's data channels and shard queues, asked of their actors (Ray I/O): a
channel's `watch()` (items queued, delivered so far), a shard queue's `progress()` (shards to
do, done). One that does not answer in time keeps its last view."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from dlu_prime.autoscale.feed import QueueView
from dlu_prime.master.state import ChannelRecord

logger = logging.getLogger(__name__)

CALL_S = 5.0


def poll_queues(records: Mapping[str, ChannelRecord]) -> dict[str, QueueView]:
    """Each channel's and shard queue's backlog now (only those that answered within CALL_S)."""
    if not records:
        return {}
    import ray

    from dlu_prime.naming import NAMESPACE

    refs: dict[Any, ChannelRecord] = {}
    for record in records.values():
        try:
            actor: Any = ray.get_actor(record.actor_name, namespace=NAMESPACE)  # pyright: ignore[reportUnknownMemberType]
            call = actor.watch if record.kind == "channel" else actor.progress
            refs[call.remote()] = record
        except Exception as exc:  # removed, or being rebuilt by Ray
            logger.debug("queue %s not polled: %s", record.name, exc)
    ready, _ = ray.wait(list(refs), num_returns=len(refs), timeout=CALL_S)  # pyright: ignore[reportUnknownMemberType]
    out: dict[str, QueueView] = {}
    for ref in ready:
        record = refs[ref]
        try:
            answer: Mapping[str, Any] = ray.get(ref)  # pyright: ignore[reportUnknownMemberType]
        except Exception as exc:
            logger.debug("queue %s not polled: %s", record.name, exc)
            continue
        out[record.name] = queue_view(record, answer)
    return out


def queue_view(record: ChannelRecord, answer: Mapping[str, Any]) -> QueueView:
    """A channel's `watch()` or a shard queue's `progress()` answer as a backlog."""

    def count(key: str) -> int:
        value = answer.get(key)
        return value if isinstance(value, int) and not isinstance(value, bool) else 0

    if record.kind == "channel":
        return QueueView(record.name, count("queued"), count("delivered"))
    return QueueView(record.name, count("todo"), count("done"))
