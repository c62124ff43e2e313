"""A state store that goes away: the job keeps running, and the latest state is written back."""

from __future__ import annotations

from typing import Any

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
    manager.flush()
    assert not manager.unsaved
    found = store.get(spec.name)
    assert found is not None
    latest = JobState.loads(found.data)
    assert latest.stage is JobStage.RUNNING
    assert latest.events[-1].message == manager.state.events[-1].message
