"""A job's status as users see it: the state's own view plus the bundles a memory relaunch left
free (`master.bundles` builds on the state, so the state does not ask it)."""

from __future__ import annotations

from dlu_api.status import JobStatus
from dlu_prime.master.bundles import free_bundles
from dlu_prime.master.state import JobState


def job_status(state: JobState, events: int = 50, events_after: int | None = None) -> JobStatus:
    """`JobState.to_status` with the job's free bundles filled in."""
    status = state.to_status(events, events_after)
    status.free_bundles = [b.text() for b in free_bundles(state)]
    return status
