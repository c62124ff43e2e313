"""Issue 27 defect 1, in the small: a write whose outcome is unknown is settled before the next.

`LateStore` is a store whose put times out but is applied later, as a hung Redis server does
when it resumes. Before the settle rule the PrimeMaster's next write expected the old token,
lost the compare-and-set to its own late write and stopped acting as "fenced by a newer
PrimeMaster": the job ran on unmonitored.
"""

from __future__ import annotations

import contextlib
import time
from typing import Any

import pytest

from dlu_prime.master.lifecycle import FencedError
from dlu_prime.master.manager import PrimeManager
from dlu_prime.master.state import JobState
from dlu_prime.state.base import StateConflictError, StateStoreUnavailableError, Versioned, settle
from dlu_prime.state.memory import MemoryStateStore

pytestmark = pytest.mark.timeout(60)


class LateStore(MemoryStateStore):
    """`hang()`: puts time out and are held, reads fail; `resume()` applies the held puts (in the
    order sent, as a resumed server does) and answers again."""

    def __init__(self) -> None:
        super().__init__()
        self.hung = False
        self.held: list[tuple[str, bytes, int | None]] = []

    def hang(self) -> None:
        self.hung = True

    def resume(self) -> None:
        self.hung = False
        held, self.held = self.held, []
        for job, data, token in held:
            with contextlib.suppress(StateConflictError):  # a late write that lost its CAS
                super().put(job, data, token)

    def put(self, job: str, data: bytes, token: int | None) -> int:
        if self.hung:
            self.held.append((job, data, token))
            raise StateStoreUnavailableError("late", "put", "timed out after 4 attempt(s)")
        return super().put(job, data, token)

    def get(self, job: str) -> Versioned | None:
        if self.hung:
            raise StateStoreUnavailableError("late", "get", "timed out")
        return super().get(job)


def _manager(make_spec: Any, fake_scheduler_factory: Any, fake_clock: Any) -> tuple[PrimeManager, LateStore]:
    spec = make_spec()
    store = LateStore()
    return PrimeManager.create(spec, fake_scheduler_factory(spec), store, clock=fake_clock), store


def _flush_until_saved(manager: PrimeManager) -> None:
    deadline = time.monotonic() + 20
    while manager.unsaved or manager.writer.dirty:
        assert time.monotonic() < deadline, "the state was never written back"
        manager.flush()
        time.sleep(0.05)


def _stored(store: LateStore, job: str) -> JobState:
    found = store.get(job)
    assert found is not None
    return JobState.loads(found.data)


def test_a_write_applied_after_its_timeout_does_not_fence_the_only_master(
    make_spec: Any, fake_scheduler_factory: Any, fake_clock: Any
) -> None:
    manager, store = _manager(make_spec, fake_scheduler_factory, fake_clock)
    job = manager.state.job
    store.hang()
    manager.record_event("node_check", "written while the store hangs")  # times out, held
    assert manager.unsaved and len(store.held) == 1
    store.resume()  # the held write lands now, behind the writer's back
    manager.record_event("node_check", "after the store came back")
    _flush_until_saved(manager)
    state = _stored(store, job)
    assert state.events[-1].message == manager.state.events[-1].message
    assert state == manager.state  # the stored document is the state in memory
    kinds = [e.kind for e in state.events]
    assert kinds.count("state_store_unavailable") == 1 and kinds.count("state_store_restored") == 1


def test_a_late_write_landing_between_settle_and_put_is_recognised(
    make_spec: Any, fake_scheduler_factory: Any, fake_clock: Any
) -> None:
    """The late write lands after the read-back found nothing: the next put loses its
    compare-and-set to it, settles again, finds its own write and writes on top."""
    manager, store = _manager(make_spec, fake_scheduler_factory, fake_clock)
    store.hang()
    manager.record_event("node_check", "held")
    held = list(store.held)
    store.held.clear()
    store.resume()  # reachable, but the held write has not landed yet
    original = MemoryStateStore.put

    def put_after_the_late_write(job: str, data: bytes, token: int | None) -> int:
        if held:
            late_job, late_data, late_token = held.pop()
            original(store, late_job, late_data, late_token)
        return original(store, job, data, token)

    store.put = put_after_the_late_write  # type: ignore[method-assign]
    _flush_until_saved(manager)
    assert _stored(store, manager.state.job) == manager.state


def test_a_late_write_after_the_next_write_is_refused_by_the_store(
    make_spec: Any, fake_scheduler_factory: Any, fake_clock: Any
) -> None:
    manager, store = _manager(make_spec, fake_scheduler_factory, fake_clock)
    store.hang()
    manager.record_event("node_check", "held")
    held = list(store.held)
    store.held.clear()
    store.resume()
    _flush_until_saved(manager)
    for job, data, token in held:  # the hung server executes it only now: its token is old
        with pytest.raises(StateConflictError):
            MemoryStateStore.put(store, job, data, token)
    assert _stored(store, manager.state.job) == manager.state


def test_another_writer_still_fences(make_spec: Any, fake_scheduler_factory: Any, fake_clock: Any) -> None:
    manager, store = _manager(make_spec, fake_scheduler_factory, fake_clock)
    job = manager.state.job
    store.hang()
    manager.record_event("node_check", "held")
    store.held.clear()  # never lands
    store.resume()
    current = store.get(job)
    assert current is not None
    store.put(job, current.data.replace(b"held", b"other"), current.token)  # a newer PrimeMaster
    deadline = time.monotonic() + 20
    with pytest.raises(FencedError, match="another PrimeMaster"):
        while time.monotonic() < deadline:
            manager.flush()
            time.sleep(0.05)


def test_settle_reads_back_by_document_and_token() -> None:
    store = MemoryStateStore()
    first = store.put("job", b"a", None)
    assert settle(store, "job", first, b"b").landed is False
    second = store.put("job", b"b", first)
    found = settle(store, "job", first, b"x", b"b")
    assert (found.landed, found.token) == (True, second)
    with pytest.raises(StateConflictError, match="fenced"):
        settle(store, "job", first, b"x")  # a newer version that is not ours
