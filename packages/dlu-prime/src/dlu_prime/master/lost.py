"""A job whose PrimeMaster is gone for good: its stored state is closed with the real reason.

Ray stops rebuilding the PrimeMaster once `master_max_restart` is used up; nothing is left to
write the job's end. Whoever follows the job (the launcher, `dlu stop`) closes the stored state
instead, so every later reader sees it STOPPED, with the limit and the cause named and no actor
listed as running, not the RUNNING stage the last PrimeMaster saved.
"""

from __future__ import annotations

import logging
import time

from dlu_api.status import JobStage, JobStatus
from dlu_prime.master.state import JobState, Tier, close_actors
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
    try:
        stored = store.get(job)
        if stored is None:
            return None
        state = JobState.loads(stored.data)
        if state.stage is JobStage.STOPPED:
            return state.to_status()
        reason = lost_master_reason(state, cause)
        before = state.stage
        state.stage = JobStage.STOPPED
        state.exit_code = EXIT_FAILED
        state.reason = reason
        state.failover = None
        close_actors(state)
        now = time.time()
        state.record("master_lost", reason, tier=Tier.MASTER, at=now)
        state.record("stage", f"{before.value} -> STOPPED: {reason}", at=now)
        state.updated_at = now
        store.put(job, state.dumps(), stored.token)
        return state.to_status()
    except StateConflictError:
        found = store.get(job)
        return JobState.loads(found.data).to_status() if found is not None else None
    except StateStoreError as exc:
        logger.warning("job %s: could not record that its PrimeMaster is gone: %s", job, exc)
        return None
