"""How a PrimeManager comes to be: a new run of a job, a job-level restart of a stored one
(`dlu resume`), or a reconstructed PrimeMaster loading the saved state (tier 6). Each reads the
store once and hands the manager the token it must write with."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, Protocol, TypeVar

from dlu_api.spec.models import JobSpec
from dlu_api.vocabulary import EventKind
from dlu_prime.extension import Extension
from dlu_prime.master.changes import Change, Note
from dlu_prime.master.core.events import Event, MasterRebuilt
from dlu_prime.master.debug import DebugTools
from dlu_prime.master.lifecycle import (
    EXIT_FAILED,
    FencedError,
    IllegalTransition,
    ResumeError,
    new_state,
    resume_problem,
    resumed_state,
)
from dlu_prime.master.schema import refuse_newer
from dlu_prime.master.state import JobState
from dlu_prime.scheduler.base import Scheduler
from dlu_prime.state.base import StateStore

logger = logging.getLogger(__name__)


class Built(Protocol):
    """What construction needs of the manager it builds."""

    state: JobState
    debug: DebugTools

    def apply(self, *changes: Change) -> None: ...
    def handle(self, event: Event) -> Any: ...
    def finish(self, exit_code: int, reason: str) -> None: ...


M = TypeVar("M", bound=Built)
Factory = Callable[
    [JobState, Scheduler, StateStore, "int | None", Callable[[], float], "Extension | None"], M
]


def create(
    cls: Factory[M],
    spec: JobSpec,
    scheduler: Scheduler,
    store: StateStore,
    clock: Callable[[], float],
    extension: Extension | None,
) -> M:
    """A new run of the job. Any stored state of an earlier run with this name is replaced,
    so a resubmitted job never picks up a finished job's results.

    Raises:
        SchemaVersionError: the stored state was written by a newer dlu-prime (not replaced).
    """
    existing = store.get(spec.name)
    if existing is not None:
        refuse_newer(spec.name, existing.data)
    manager = cls(new_state(spec), scheduler, store, existing.token if existing else None, clock, extension)
    manager.apply(Note(EventKind.JOB_CREATED, f"job {spec.name} created (run {manager.state.run_id[:8]})"))
    return manager


def resume(
    cls: Factory[M],
    spec: JobSpec,
    scheduler: Scheduler,
    store: StateStore,
    clock: Callable[[], float],
    extension: Extension | None,
) -> M:
    """A job-level restart of a stored job, possibly on a new Ray cluster: a fresh run that
    keeps the counters, budgets and timeline of the stored one (the user's checkpoints give
    the training progress).

    Raises:
        ResumeError: nothing stored, the job already succeeded, or a restart limit is used up.
    """
    stored = store.get(spec.name)
    old = JobState.loads(stored.data) if stored is not None else None
    problem = resume_problem(spec, old)
    if problem is not None or stored is None or old is None:
        raise ResumeError(problem or "nothing to resume")
    state = resumed_state(spec, old)
    manager = cls(state, scheduler, store, stored.token, clock, extension)
    why = old.reason.splitlines()[0] if old.reason else "no reason recorded"
    restarts = f"restart {state.job_restart_count}/{spec.limits.job_max_restart}"
    manager.apply(
        Note(
            EventKind.JOB_RESUMED,
            f"job {spec.name} resumed ({restarts}) after stage {old.stage.value}: {why}",
        )
    )
    return manager


def self_recover(
    cls: Factory[M],
    spec: JobSpec,
    scheduler: Scheduler,
    store: StateStore,
    clock: Callable[[], float],
    extension: Extension | None,
) -> M | None:
    """Tier 6: a reconstructed PrimeMaster loads the saved state and self-recovers. RUNNING
    resumes monitoring with the actors it finds (healthy workers untouched; an in-flight
    failover or resize is finished by the loop); any other stage, or an error here, stops the
    job safely. None when nothing is stored."""
    stored = store.get(spec.name)
    if stored is None:
        return None
    manager = cls(JobState.loads(stored.data), scheduler, store, stored.token, clock, extension)
    try:
        manager.handle(MasterRebuilt())
        manager.debug.reinject_pending()  # marks saved that the dead PrimeMaster's pass never judged
    except (FencedError, IllegalTransition):
        raise
    except Exception as exc:
        logger.exception("job %s: self-recovery failed", manager.state.job)
        manager.finish(EXIT_FAILED, f"PrimeMaster self-recovery failed: {type(exc).__name__}: {exc}")
    return manager
