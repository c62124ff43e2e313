"""Workloads of the `dlu scale` tests. Importing this module in an actor of rank >= SLOW_FROM
sleeps SLOW_S first: its self check (which imports the entrypoint) is slow, so a resize that adds
such actors is reliably still in flight when the test kills the PrimeMaster."""

from __future__ import annotations

import os
import time

from workloads import forever

SLOW_FROM = int(os.environ.get("SCALE_SLOW_FROM", "1000000"))
if int(os.environ.get("ROLE_RANK", "0")) >= SLOW_FROM:
    time.sleep(float(os.environ.get("SCALE_SLOW_S", "0")))

__all__ = ["forever", "slow_shards"]


def slow_shards() -> None:
    """Takes shards of the job's queue `data` one at a time, holds each SHARD_S seconds, and
    keeps its running record count with each completion (so the test can add them up)."""
    from dlu_prime.runtime import consumer_id, heartbeat, shard_queue

    hold_s = float(os.environ.get("SHARD_S", "1.0"))
    queue = shard_queue("data", dataset_size=60, shard_size=3)
    me = consumer_id()
    count = queue.restore(me) or 0
    beats = 0
    while True:
        shard = queue.next_shard(me)
        if shard is not None:
            time.sleep(hold_s)
            records = shard.end - shard.start
            if queue.complete(me, shard.id, state=count + records):
                count += records
        else:
            time.sleep(0.1)
        beats += 1
        heartbeat(beats)
