"""`dlu status` of a running PrimeMaster: the persisted state plus the live training steps and
metrics (kept in memory, not worth a write), read without ever waiting on a hung store."""

from __future__ import annotations

import threading

from dlu_api.status import JobStatus
from dlu_prime.master.job_status import job_status
from dlu_prime.master.liveness import Liveness
from dlu_prime.master.persistence import StateWriter
from dlu_prime.master.state import JobState

STATUS_LOCK_WAIT_S = 0.5
"""How long `status` waits for the lock before it looks whether its holder waits on the store."""


def live_status(
    state: JobState,
    lock: threading.RLock,
    writer: StateWriter,
    liveness: Liveness,
    events: int,
    events_after: int | None,
) -> JobStatus:
    """While the lock's holder is blocked in a state write (which may take the store's whole
    retry budget), the state is read without the lock, since nothing can change it meanwhile
    (every change holds the lock)."""
    locked = lock.acquire(timeout=STATUS_LOCK_WAIT_S)
    while not locked and not writer.writing:
        locked = lock.acquire(timeout=STATUS_LOCK_WAIT_S)
    try:
        status = job_status(state, events, events_after)
        steps = liveness.last_steps()
        metrics = liveness.last_metrics()
    finally:
        if locked:
            lock.release()
    for role in status.roles:
        for actor in role.actors:
            actor.step = steps.get(actor.name)
            actor.metric = metrics.get(actor.name)
    return status
