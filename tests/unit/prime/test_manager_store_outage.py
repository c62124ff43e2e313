"""A state store that goes away: the job keeps running, and the latest state is written back."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from dlu_api.status import JobStage
from dlu_prime.master.manager import PrimeManager
from dlu_prime.master.state import JobState
from dlu_prime.state.base import StateStoreUnavailableError, Versioned
from dlu_prime.state.memory import MemoryStateStore


class OutageStore(MemoryStateStore):
    """A memory store that can be switched off, like a Redis server that was stopped."""

    def __init__(self) -> None:
        super().__init__()
        self.down = False
        self.refused = 0

    def put(self, job: str, data: bytes, token: int | None) -> int:
        if self.down:
            self.refused += 1
            raise StateStoreUnavailableError("outage", "put", "connection refused")
        return super().put(job, data, token)

    def get(self, job: str) -> Versioned | None:
        if self.down:
            raise StateStoreUnavailableError("outage", "get", "connection refused")
        return super().get(job)


def flush_until_saved(manager: PrimeManager, deadline_s: float = 20.0) -> None:
    """Flush as the loop does (the probe wakes it when the store answers) until all is written."""
    deadline = time.monotonic() + deadline_s
    while manager.unsaved or manager.writer.dirty:
        assert time.monotonic() < deadline, "the state was never written back"
        manager.flush()
        time.sleep(0.05)


def test_job_runs_through_an_outage_and_the_latest_state_lands(
    make_spec: Any, fake_scheduler_factory: Any, fake_clock: Any
) -> None:
    spec = make_spec()
    store = OutageStore()
    scheduler = fake_scheduler_factory(spec)
    manager = PrimeManager.create(spec, scheduler, store, clock=fake_clock)
    manager.prepare()
    store.down = True
    manager.start()  # READY -> RUNNING while the store is away: the job goes on
    assert manager.state.stage is JobStage.RUNNING
    assert manager.unsaved and store.refused >= 1
    stored = MemoryStateStore.get(store, spec.name)
    assert stored is not None
    assert JobState.loads(stored.data).stage is JobStage.READY  # the store still has the old state
    store.down = False
    flush_until_saved(manager)
    found = store.get(spec.name)
    assert found is not None
    latest = JobState.loads(found.data)
    assert latest.stage is JobStage.RUNNING
    assert latest.events[-1].message == manager.state.events[-1].message
    kinds = [e.kind for e in latest.events]
    assert kinds.count("state_store_unavailable") == 1 and kinds.count("state_store_restored") == 1
    assert kinds.index("state_store_unavailable") < kinds.index("state_store_restored")


def test_no_save_blocks_on_the_store_during_an_outage(
    make_spec: Any, fake_scheduler_factory: Any, fake_clock: Any
) -> None:
    """Once a write found the store away, later saves do not try it (each try may block for the
    store's retry budget) until the probe finds it back."""
    spec = make_spec()
    store = OutageStore()
    manager = PrimeManager.create(spec, fake_scheduler_factory(spec), store, clock=fake_clock)
    store.down = True
    manager.record_event("node_check", "one")
    refused = store.refused
    for n in range(20):
        manager.record_event("node_check", f"more {n}")
    assert store.refused == refused == 1
    assert [e.kind for e in manager.status().events].count("state_store_unavailable") == 1
    store.down = False
    flush_until_saved(manager)
    assert store.refused == 1


class HangingStore(MemoryStateStore):
    """A memory store whose puts hang while `free` is clear, like a SIGSTOPped server."""

    def __init__(self) -> None:
        super().__init__()
        self.free = threading.Event()
        self.free.set()
        self.entered = threading.Event()

    def put(self, job: str, data: bytes, token: int | None) -> int:
        self.entered.set()
        self.free.wait(30)
        return super().put(job, data, token)


def test_status_answers_while_a_write_hangs_and_the_log_says_so(
    make_spec: Any, fake_scheduler_factory: Any, fake_clock: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """Issue 27: a hung store stalled everything behind the manager's lock, `dlu status` too,
    without a word."""
    spec = make_spec()
    store = HangingStore()
    manager = PrimeManager.create(spec, fake_scheduler_factory(spec), store, clock=fake_clock)
    manager.writer.slow_write_s = 0.2
    store.free.clear()
    store.entered.clear()
    writer = threading.Thread(target=manager.record_event, args=("node_check", "written into a hung store"))
    writer.start()
    assert store.entered.wait(10)
    answers: list[Any] = []
    reader = threading.Thread(target=lambda: answers.append(manager.status()))
    reader.start()
    reader.join(20)
    deadline = time.monotonic() + 20
    while "has not answered a write" not in caplog.text and time.monotonic() < deadline:
        time.sleep(0.05)
    hung_meanwhile = not store.free.is_set() and writer.is_alive()
    store.free.set()
    writer.join(20)
    assert answers and hung_meanwhile, "status waited for the hung write"
    assert answers[0].events[-1].message == "written into a hung store"
    assert f"job {spec.name}: the state store has not answered a write" in caplog.text
