"""Writing the job's state: compare-and-set with a fencing token, riding out a store outage.

A lost compare-and-set means another PrimeMaster owns the job; an unreachable store means the
job runs on from memory and the whole document is written (never an older one over a newer)
as soon as the store is back.

Settle rule: a put that timed out may have landed, or may land when a hung server resumes.
Before the next write it is settled (`dlu_prime.state.settle`: read back by its document and
token), so this PrimeMaster's own late write never reads as a newer PrimeMaster's, and no length
of outage fences the only master. While the store is away, saves do not block: a probe thread
waits for it and wakes the loop. The outage and its end are events on the timeline.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from dlu_api.vocabulary import EventKind
from dlu_prime.master.document import DocumentEncoder
from dlu_prime.master.lifecycle import FencedError
from dlu_prime.master.state import JobState
from dlu_prime.state.base import (
    StateConflictError,
    StateStore,
    StateStoreError,
    StateStoreUnavailableError,
    settle,
)

logger = logging.getLogger(__name__)

FINAL_SAVE_PATIENCE_S = 120.0
SLOW_WRITE_S = 2.0
"""A write that has not answered after this long is logged as slow (it may block for the
store's whole retry budget)."""
PROBE_FIRST_S = 0.2
PROBE_MAX_S = 5.0

Record = Callable[[EventKind, str, float | None], None]
"""Records an event (kind, message, duration) on the in-memory timeline, without a save."""


@dataclass(frozen=True)
class _Unknown:
    """Puts that raised unavailable: the token they all expected and exactly what each wrote
    (at most one of them can land)."""

    token: int | None
    written: tuple[bytes, ...]


class SlowWriteWatch:
    """Warns once about each state write that has not answered after its threshold: one daemon
    thread per process, started with the first write, looks every `period_s` (a thread per write
    would cost more than the write on a fast store)."""

    def __init__(self, period_s: float = 0.5) -> None:
        self._period_s = period_s
        self._lock = threading.Lock()
        self._writes: dict[int, tuple[str, float, float]] = {}  # key -> job, start, threshold
        self._warned: set[int] = set()
        self._keys = itertools.count()
        self._thread: threading.Thread | None = None

    def begin(self, job: str, threshold_s: float) -> int:
        with self._lock:
            key = next(self._keys)
            self._writes[key] = (job, time.monotonic(), threshold_s)
            if self._thread is None:
                self._thread = threading.Thread(target=self._watch, name="dlu-state-slow-writes", daemon=True)
                self._thread.start()
        return key

    def end(self, key: int) -> None:
        with self._lock:
            self._writes.pop(key, None)
            self._warned.discard(key)

    def _watch(self) -> None:
        while True:
            time.sleep(self._period_s)
            now = time.monotonic()
            with self._lock:
                slow = [
                    (key, job, now - started)
                    for key, (job, started, threshold) in self._writes.items()
                    if now - started >= threshold and key not in self._warned
                ]
                self._warned.update(key for key, _, _ in slow)
            for _, job, waited in slow:
                logger.warning(
                    "job %s: the state store has not answered a write for %.1fs; the job's state "
                    "changes wait for it (up to the store's retry budget; `dlu status` still answers)",
                    job,
                    waited,
                )


SLOW_WRITES = SlowWriteWatch()


class StateWriter:
    def __init__(
        self,
        store: StateStore,
        token: int | None,
        record: Record | None = None,
        wake: Callable[[], None] | None = None,
        slow_write_s: float = SLOW_WRITE_S,
    ) -> None:
        self.store = store
        self.token = token
        self.unsaved = False  # the last save could not reach the store
        self.dirty = False  # an event was recorded after the last write (it needs one more)
        self.writing = False  # a put is under way (its caller holds the manager's lock)
        self._record = record
        self._wake = wake
        self.slow_write_s = slow_write_s
        self._unknown: _Unknown | None = None  # a write to settle before the next one
        self._outage_since: float | None = None
        self._reachable = threading.Event()  # set by the probe: the store answers again
        self._probe: threading.Thread | None = None
        self._closed = threading.Event()
        self._document = DocumentEncoder()  # each actor's JSON, kept between writes

    def save(self, state: JobState) -> None:
        """Write the whole document; during an outage, only once the probe found the store back.

        Raises:
            FencedError: another PrimeMaster wrote the document after us."""
        if self.unsaved and not self._reachable.is_set():
            return  # the probe wakes the loop when the store answers; nothing blocks till then
        self._reachable.clear()
        data = b""
        try:
            self._settle(state.job)
            data = self._document.encode(state)
            try:
                self.token = self._put(state.job, data, self.token)
            except StateConflictError:
                if self._unknown is None or not self._settle(state.job):
                    raise
                self.token = self._put(state.job, data, self.token)  # our late write landed first
            self._unknown = None
        except StateConflictError as exc:
            raise FencedError(f"job {state.job}: state was written by another PrimeMaster ({exc})") from exc
        except StateStoreUnavailableError as exc:
            self._outage(state, data, exc)
            return
        self.dirty = False
        if self.unsaved:
            self.unsaved = False
            self._restored(state)

    def flush_final(self, save: Callable[[], None], patience_s: float = FINAL_SAVE_PATIENCE_S) -> None:
        """The job ended while the store was away: keep trying (`save()`), so its end is not lost."""
        deadline = time.monotonic() + patience_s
        while (self.unsaved or self.dirty) and time.monotonic() < deadline:
            self._reachable.wait(min(1.0, max(0.0, deadline - time.monotonic())))
            save()
        if self.unsaved:
            logger.error("final state could not be written to the store")
        self._closed.set()

    def retain(self, job: str) -> None:
        """A finished job's state may expire (the store's retention); a failure here is harmless."""
        if self.unsaved:
            return
        try:
            if self.store.retain(job, self.token):
                logger.info("job %s: state kept for the store's retention period", job)
        except StateStoreError as exc:
            logger.warning("job %s: could not set state retention: %s", job, exc)

    # internals -------------------------------------------------------------------------------
    def _settle(self, job: str) -> bool:
        """Settle a write of unknown outcome; whether it had landed (then its token is ours)."""
        unknown = self._unknown
        if unknown is None:
            return False
        settled = settle(self.store, job, unknown.token, *unknown.written)
        if settled.landed:
            logger.info("job %s: the write that timed out had landed (token %s)", job, settled.token)
            self.token = settled.token
            self._unknown = None
        return settled.landed

    def _put(self, job: str, data: bytes, token: int | None) -> int:
        """One put; a word in the log if it is slow (`SLOW_WRITES`), so no stall passes silently."""
        key = SLOW_WRITES.begin(job, self.slow_write_s)
        self.writing = True
        try:
            return self.store.put(job, data, token)
        finally:
            self.writing = False
            SLOW_WRITES.end(key)

    def _outage(self, state: JobState, data: bytes, exc: StateStoreUnavailableError) -> None:
        if data:  # the put was sent (not only the read-back): it may land
            known = self._unknown.written if self._unknown is not None else ()
            self._unknown = _Unknown(self.token, (*known, data))
        if not self.unsaved:
            self._outage_since = time.monotonic()
            logger.warning("job %s: state store unavailable, running on (%s)", state.job, exc)
            if self._record is not None:
                self._record(
                    EventKind.STATE_STORE_UNAVAILABLE,
                    f"state store {self.store.name!r} unavailable; the job runs on and its state is "
                    f"written when the store is back ({exc.detail})",
                    None,
                )
        self.unsaved = True
        self._start_probe(state.job)

    def _restored(self, state: JobState) -> None:
        lasted = time.monotonic() - self._outage_since if self._outage_since is not None else None
        self._outage_since = None
        logger.info("job %s: state store back; latest state written", state.job)
        if self._record is not None:
            took = f" after {lasted:.1f}s" if lasted is not None else ""
            self._record(
                EventKind.STATE_STORE_RESTORED,
                f"state store {self.store.name!r} back{took}; the latest state is written",
                lasted,
            )
            self.dirty = True  # the event is written by the next flush
        if self._wake is not None:
            self._wake()

    def _start_probe(self, job: str) -> None:
        if self._probe is not None and self._probe.is_alive():
            return
        self._probe = threading.Thread(
            target=self._wait_for_store, args=(job,), name="dlu-state-probe", daemon=True
        )
        self._probe.start()

    def _wait_for_store(self, job: str) -> None:
        delay = PROBE_FIRST_S
        while not self._closed.is_set():
            try:
                self.store.get(job)
            except StateStoreUnavailableError:
                self._closed.wait(delay)
                delay = min(delay * 2, PROBE_MAX_S)
                continue
            except StateStoreError:
                pass  # it answers; the write will say what is wrong
            self._reachable.set()
            if self._wake is not None:
                self._wake()
            return
