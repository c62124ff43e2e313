"""In-process state store: the reference implementation of the contract, for unit tests.

Nothing survives the process, so it is no use for failover in a real job.
"""

from __future__ import annotations

import logging
import threading

from dlu_prime.state.base import (
    StateConflictError,
    StateStore,
    Versioned,
    describe_conflict,
    validate_data,
    validate_job,
    validate_token,
)

logger = logging.getLogger(__name__)


class MemoryStateStore(StateStore):
    """A dict of `Versioned` guarded by one lock, which makes every compare-and-set atomic."""

    name = "memory"

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._docs: dict[str, Versioned] = {}

    def get(self, job: str) -> Versioned | None:
        validate_job(job)
        with self._lock:
            return self._docs.get(job)

    def put(self, job: str, data: bytes, token: int | None) -> int:
        validate_job(job)
        validate_data(data)
        validate_token(token)
        with self._lock:
            current = self._docs.get(job)
            current_token = current.token if current else None
            if current_token != token:
                raise StateConflictError(
                    self.name, f"put of job {job!r}", describe_conflict(token, current_token)
                )
            new_token = 1 if token is None else token + 1
            self._docs[job] = Versioned(data, new_token)
        logger.debug("job %r saved at token %d", job, new_token)
        return new_token

    def delete(self, job: str, token: int | None = None) -> None:
        validate_job(job)
        validate_token(token)
        with self._lock:
            current = self._docs.get(job)
            if current is None:
                return
            if token is not None and current.token != token:
                raise StateConflictError(
                    self.name, f"delete of job {job!r}", describe_conflict(token, current.token)
                )
            del self._docs[job]

    def list_jobs(self) -> list[str]:
        with self._lock:
            return sorted(self._docs)
