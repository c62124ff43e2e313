"""The job's state as the PrimeManager keeps it: the one code that changes it (`apply`, each
change by `changes.apply_change`), writes it (`save`, through the `StateWriter`) before anything
acts on it, and then lets the hooks react (the log, metrics, auto-scaling). `atomic` makes a
decision and the ones that follow from it one write. Its lock is the manager's: the state is
read and changed under it on every thread."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Generator
from contextlib import contextmanager

from dlu_api.status import JobEvent, JobStage
from dlu_api.vocabulary import EventKind
from dlu_prime.master.changes import Change, StageChanged, apply_change
from dlu_prime.master.hooks import HookHost, failover_metrics, log_stage
from dlu_prime.master.lifecycle import ALLOWED, IllegalTransition
from dlu_prime.master.persistence import StateWriter
from dlu_prime.state.base import StateStore

logger = logging.getLogger(__name__)

ChangeHook = Callable[[HookHost, Change, list[JobEvent]], None]


class StateKeeper:
    def __init__(
        self,
        host: HookHost,
        store: StateStore,
        token: int | None,
        clock: Callable[[], float],
        wake: Callable[[], None],
    ) -> None:
        self._host = host  # holds the state (and what the hooks read: its metrics)
        self._clock = clock
        self.lock = threading.RLock()
        self.writer = StateWriter(store, token, self._record_unsaved, wake)
        self.hooks: list[ChangeHook] = [log_stage, failover_metrics]
        self._batch: list[tuple[Change, list[JobEvent]]] | None = None  # applied, saved at the end

    def apply(self, *changes: Change) -> None:
        """The only code that changes the state: apply each change, save once, then let the hooks
        react to each change with the events it recorded.

        Raises:
            FencedError: another PrimeMaster wrote the state after us.
        """
        with self.lock:
            now = self._clock()
            state = self._host.state
            applied = [(change, apply_change(state, change, now)) for change in changes]
            if self._batch is not None:
                self._batch.extend(applied)  # saved with the rest of the batch (`atomic`)
                return
            self.save()
            self._react(applied)

    @contextmanager
    def atomic(self) -> Generator[None]:
        """Every change applied inside is saved in one write at the end: a decision and the ones
        that follow from it at once (a pass's failure and the recovery it begins) are stored
        together, so a PrimeMaster that dies between them loses neither (nested: the outer)."""
        with self.lock:
            if self._batch is not None:
                yield
                return
            self._batch = []
            try:
                yield
            finally:
                applied, self._batch = self._batch, None
                if applied:
                    self.save()
                    self._react(applied)

    def save(self) -> None:
        """Write the whole document (see `StateWriter.save`)."""
        with self.lock:
            state = self._host.state
            state.updated_at = self._clock()
            self.writer.save(state)

    def flush(self) -> None:
        """Write the state if an earlier save could not reach the store (or recorded its return)."""
        if self.writer.unsaved or self.writer.dirty:
            self.save()

    def transition(self, stage: JobStage, reason: str = "", exit_code: int | None = None) -> None:
        """The only place the job's stage changes: check, then apply (saved before anyone acts)."""
        with self.lock:
            current = self._host.state.stage
            if stage not in ALLOWED[current]:
                raise IllegalTransition(f"{current.value} -> {stage.value}")
            self.apply(StageChanged(stage, reason, exit_code))

    def _react(self, applied: list[tuple[Change, list[JobEvent]]]) -> None:
        for change, events in applied:
            for hook in self.hooks:
                try:
                    hook(self._host, change, events)
                except Exception:
                    logger.exception("job %s: a state-change hook failed", self._host.state.job)

    def _record_unsaved(self, kind: EventKind, message: str, duration_s: float | None) -> None:
        """An event of the state writer itself (a store outage and its end): on the timeline at
        once, so `dlu status` and the console show it; written with the next save."""
        with self.lock:
            self._host.state.record(kind, message, at=self._clock(), duration_s=duration_s)
