"""Writing the job's state: compare-and-set with a fencing token, riding out a store outage.

A lost compare-and-set means another PrimeMaster owns the job; an unreachable store means the
job runs on from memory and the whole document is written (never an older one over a newer)
as soon as the store is back.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from dlu_prime.master.lifecycle import FencedError
from dlu_prime.master.state import JobState
from dlu_prime.state.base import StateConflictError, StateStore, StateStoreError, StateStoreUnavailableError

logger = logging.getLogger(__name__)

FINAL_SAVE_PATIENCE_S = 120.0


class StateWriter:
    def __init__(self, store: StateStore, token: int | None) -> None:
        self.store = store
        self.token = token
        self.unsaved = False  # the last save could not reach the store

    def save(self, state: JobState) -> None:
        """Raises:
        FencedError: another PrimeMaster wrote the document after us."""
        try:
            self.token = self.store.put(state.job, state.dumps(), self.token)
        except StateConflictError as exc:
            raise FencedError(f"job {state.job}: state was written by another PrimeMaster ({exc})") from exc
        except StateStoreUnavailableError as exc:
            if not self.unsaved:
                logger.warning("job %s: state store unavailable, running on (%s)", state.job, exc)
            self.unsaved = True
            return
        if self.unsaved:
            logger.info("job %s: state store back; latest state written", state.job)
        self.unsaved = False

    def flush_final(self, save: Callable[[], None], patience_s: float = FINAL_SAVE_PATIENCE_S) -> None:
        """The job ended while the store was away: keep trying (`save()`), so its end is not lost."""
        deadline = time.monotonic() + patience_s
        delay = 0.2
        while self.unsaved and time.monotonic() < deadline:
            time.sleep(delay)
            delay = min(delay * 2, 5.0)
            save()
        if self.unsaved:
            logger.error("final state could not be written to the store")

    def retain(self, job: str) -> None:
        """A finished job's state may expire (the store's retention); a failure here is harmless."""
        if self.unsaved:
            return
        try:
            if self.store.retain(job, self.token):
                logger.info("job %s: state kept for the store's retention period", job)
        except StateStoreError as exc:
            logger.warning("job %s: could not set state retention: %s", job, exc)
