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


def _counting_table_reads(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Counts passes over the process table (psutil's children() makes one per call)."""
    reads: list[int] = []
    real = psutil._ppid_map  # pyright: ignore[reportPrivateUsage, reportAttributeAccessIssue]

    def counted() -> dict[int, int]:
        reads.append(1)
        return real()

    monkeypatch.setattr(psutil, "_ppid_map", counted)
    return reads


def test_polls_in_a_row_read_the_process_table_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """An agent's status answer (its pid and its training process's, polled every 0.1 s) read
    every process's parent four times per call: most of the agent's CPU, during a restart too."""
    reads = _counting_table_reads(monkeypatch)
    sampler = UsageSampler()
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        for _ in range(5):
            assert sampler.sample([os.getpid(), child.pid])["memory_bytes"] > 0
        assert len(reads) == 1
    finally:
        child.kill()
        child.wait()


def test_the_process_table_is_read_again_once_stale() -> None:
    from dlu_prime.stats.process_tree import ProcessTree

    clock = [0.0]
    tree = ProcessTree(max_age_s=1.0, clock=lambda: clock[0])
    tree.descendants(os.getpid())  # the map is read now
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        assert child.pid not in tree.descendants(os.getpid())  # the map is still the old one
        clock[0] += 1.0
        assert child.pid in tree.descendants(os.getpid())
        assert tree.passes == 2
        sampler = UsageSampler(tree)
        assert sampler.sample([os.getpid()])["memory_bytes"] > 0
        assert child.pid in sampler._sampler._procs  # pyright: ignore[reportPrivateUsage]
    finally:
        child.kill()
        child.wait()
    assert child.pid not in tree.descendants(os.getpid())  # reaped: left out before the next read
