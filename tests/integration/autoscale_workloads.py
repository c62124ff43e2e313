"""Roles of the auto-scaling integration test: a driver that fills a data channel faster than
one worker drains it, and workers that drain it (half a second per item, a heartbeat each)."""

from __future__ import annotations

import os
import time

from dlu_prime.runtime.context import heartbeat
from dlu_prime.runtime.data import channel, consumer_id
from dlu_prime.runtime.data_channel import ChannelTimeoutError


def produce() -> None:
    samples = channel("samples")
    items = int(os.environ.get("AUTOSCALE_ITEMS", "60"))
    samples.put_many(range(items))
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and samples.stats()["delivered"] < items:
        time.sleep(0.5)


def drain() -> None:
    samples = channel("samples")
    me = consumer_id()
    done = 0
    while True:
        try:
            samples.get(me, timeout=1.0)
        except ChannelTimeoutError:
            heartbeat(done)
            continue
        time.sleep(0.5)
        done += 1
        heartbeat(done)


def curve() -> None:
    """An elastic rank (one per node) whose step takes CURVE_COMPUTE_S / N + CURVE_COMM_S x (N - 1)
    at N nodes (a fixed global batch shared by the nodes, a communication cost growing with N),
    a heartbeat each, until the wall-clock time CURVE_END: every rank of every world ends then."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    pause = float(os.environ["CURVE_COMPUTE_S"]) / world + float(os.environ["CURVE_COMM_S"]) * (world - 1)
    end = float(os.environ["CURVE_END"])
    step = 0
    while time.time() < end:
        time.sleep(pause)
        step += 1
        heartbeat(step)
