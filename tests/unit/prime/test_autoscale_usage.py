"""An actor's own CPU and memory (psutil), as its status answers them."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import psutil
import pytest

from dlu_prime.scheduler.base import ActorObservation
from dlu_prime.stats.usage import UsageSampler

pytestmark = pytest.mark.timeout(60)


def test_the_actor_counts_itself_and_its_children_once() -> None:
    sampler = UsageSampler()
    code = "import time; x = bytearray(64 * 2**20); time.sleep(30)"
    child = subprocess.Popen([sys.executable, "-c", code])
    try:
        deadline = time.monotonic() + 30
        while psutil.Process(child.pid).memory_info().rss < 48 * 2**20:  # its 64 MiB touched
            assert time.monotonic() < deadline
            time.sleep(0.05)
        child_rss = psutil.Process(child.pid).memory_info().rss
        first = sampler.sample([os.getpid(), child.pid])  # the child is also a child of this process
        alone = UsageSampler().sample([os.getpid()])
        assert abs(first["memory_bytes"] - alone["memory_bytes"]) < child_rss / 2  # not counted twice
        assert first["cpu_percent"] >= 0
    finally:
        child.kill()
        child.wait()
    sampler.sample([os.getpid()])
    assert child.pid not in sampler._sampler._procs  # pyright: ignore[reportPrivateUsage]


def test_a_process_gone_gives_nothing() -> None:
    done = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    )
    assert UsageSampler().sample([int(done.stdout)]) == {}


def test_the_poll_carries_the_usage() -> None:
    seen = ActorObservation.from_status({"stage": "RUNNING", "cpu_percent": 12.5, "memory_bytes": 2048})
    assert (seen.cpu_percent, seen.memory_bytes) == (12.5, 2048)
    bad = ActorObservation.from_status({"stage": "RUNNING", "cpu_percent": "x", "memory_bytes": -1})
    assert (bad.cpu_percent, bad.memory_bytes) == (None, None)
