"""A job whose PrimeMaster is gone for good: its stored state is closed with the real reason.

Ray stops rebuilding the PrimeMaster once `master_max_restart` is used up; nothing is left to
write the job's end. Whoever follows the job (the launcher, `dlu stop`) closes the stored state
instead, so every later reader sees it STOPPED, with the limit and the cause named and no actor
listed as running, not the RUNNING stage the last PrimeMaster saved.

The same holds for a job stopped at once (a second Ctrl-C on `dlu run`): its PrimeMaster is
killed before it can write the end, so the process that killed it writes it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from dlu_api.status import JobStage, JobStatus
from dlu_api.vocabulary import EventKind, Tier
from dlu_prime.master.job_status import job_status
from dlu_prime.master.state import JobState, close_actors
from dlu_prime.state.base import StateConflictError, StateStore, StateStoreError

logger = logging.getLogger(__name__)

EXIT_FAILED = 1


def lost_master_reason(state: JobState, cause: str) -> str:
    """Why the job stopped when its PrimeMaster is gone: the limit when it was used up."""
    limit = state.spec.limits.master_max_restart
    deaths = state.master_restart_count + 1
    if state.master_restart_count >= limit:
        return (
            f"master_max_restart={limit} reached: the PrimeMaster died {deaths} time(s); "
            f"last: {cause}; last stage {state.stage.value}"
        )
    return f"its PrimeMaster is gone ({cause}); last stage {state.stage.value}"


def close_lost_job(store: StateStore, job: str, cause: str) -> JobStatus | None:
    """Write the job's end into its stored state; its status, or None if nothing is stored.

    A state already STOPPED is returned unchanged. If a PrimeMaster wrote meanwhile (the token
    moved), it is alive after all: its state is returned as it is.
    """
    return _close(
        store,
        job,
        lambda state: lost_master_reason(state, cause),
        EXIT_FAILED,
        EventKind.MASTER_LOST,
        Tier.MASTER,
    )


def close_killed_job(store: StateStore, job: str, reason: str, exit_code: int) -> JobStatus | None:
    """Write the end of a job whose PrimeMaster and actors were just killed on purpose (a
    stop at once); its status, or None if nothing is stored. A state already STOPPED stays."""
    return _close(store, job, lambda _state: reason, exit_code, EventKind.KILLED, None)


def _close(
    store: StateStore,
    job: str,
    reason_of: Callable[[JobState], str],
    exit_code: int,
    kind: EventKind,
    tier: Tier | None,
) -> JobStatus | None:
    try:
        stored = store.get(job)
        if stored is None:
            return None
        state = JobState.loads(stored.data)
        if state.stage is JobStage.STOPPED:
            return job_status(state)
        reason = reason_of(state)
        before = state.stage
        state.stage = JobStage.STOPPED
        state.exit_code = exit_code
        state.reason = reason
        state.failover = None
        close_actors(state)
        now = time.time()
        state.record(kind, reason, tier=tier, at=now)
        state.record(EventKind.STAGE, f"{before.value} -> STOPPED: {reason}", at=now)
        state.updated_at = now
        store.put(job, state.dumps(), stored.token)
        return job_status(state)
    except StateConflictError:
        found = store.get(job)
        return job_status(JobState.loads(found.data)) if found is not None else None
    except StateStoreError as exc:
        logger.warning("job %s: could not record its end (%s): %s", job, kind, exc)
        return None
