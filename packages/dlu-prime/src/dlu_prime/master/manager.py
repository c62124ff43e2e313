"""PrimeManager: the job's stage machine, and the one place where the job's state changes.

INIT -> READY -> RUNNING -> STOPPING -> STOPPED. Decisions are pure (`monitor.assess`,
`failover.plan_failover`, `failover.judge_inplace`); what follows from them is described as
changes (`changes.py`) and handed to `apply`, which changes the state, saves it (compare-and-set)
before anything acts on it, and then lets its hooks react (the log, metrics). A reconstructed
PrimeMaster therefore resumes from exactly what this one had decided; a lost compare-and-set
means another PrimeMaster owns the job and this one must stop touching it.

Around it: `stages.py` drives the stages (the monitoring loop), `recovery.py` runs failovers,
`setup_checks.py` the checks before a run, `registry.py` the endpoints and channels, `debug.py`
what `dlu debug` needs, `persistence.py` the store writes.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence

from dlu_api.spec.models import JobSpec
from dlu_api.status import JobEvent, JobStage, JobStatus
from dlu_api.vocabulary import EventKind, Tier
from dlu_prime.extension import Extension
from dlu_prime.master.changes import (
    Change,
    Note,
    StageChanged,
    apply_change,
)
from dlu_prime.master.debug import DebugTools
from dlu_prime.master.elastic_resize import ElasticResizer
from dlu_prime.master.hooks import failover_metrics, log_stage
from dlu_prime.master.lifecycle import (
    ALLOWED,
    EXIT_FAILED,
    EXIT_OK,
    EXIT_STOPPED,
    FencedError,
    IllegalTransition,
    RestartLimitError,
    ResumeError,
    new_state,
    resume_problem,
    resumed_state,
)
from dlu_prime.master.liveness import Liveness
from dlu_prime.master.metrics import JobMetrics
from dlu_prime.master.monitor import Assessment, Failure
from dlu_prime.master.persistence import StateWriter
from dlu_prime.master.recovery import SUB_MASTER_FAILOVER_TIMEOUT_S, FailoverRunner
from dlu_prime.master.registry import Registry
from dlu_prime.master.resizer import ResizeRunner
from dlu_prime.master.schema import refuse_newer
from dlu_prime.master.setup_checks import SetupChecks
from dlu_prime.master.stages import StageDriver
from dlu_prime.master.state import JobState
from dlu_prime.scheduler.base import ActorObservation, Scheduler
from dlu_prime.state.base import StateStore

logger = logging.getLogger(__name__)

STATUS_LOCK_WAIT_S = 0.5
"""How long `status` waits for the lock before it looks whether its holder waits on the store."""

Clock = Callable[[], float]
ChangeHook = Callable[["PrimeManager", Change, list[JobEvent]], None]

__all__ = [
    "EXIT_FAILED",
    "EXIT_OK",
    "EXIT_STOPPED",
    "FencedError",
    "IllegalTransition",
    "PrimeManager",
    "RestartLimitError",
    "ResumeError",
    "new_state",
    "resume_problem",
]


class PrimeManager:
    def __init__(
        self,
        state: JobState,
        scheduler: Scheduler,
        store: StateStore,
        token: int | None,
        clock: Clock = time.time,
        extension: Extension | None = None,
        sub_master_timeout_s: float = SUB_MASTER_FAILOVER_TIMEOUT_S,
    ) -> None:
        self.state = state
        self.scheduler = scheduler
        self.clock = clock
        self.extension = extension
        self.lock = threading.RLock()
        self.writer = StateWriter(store, token, self._record_unsaved, self.wake)
        self.metrics: JobMetrics | None = None  # set by the PrimeMaster actor (Ray metrics)
        self.hooks: list[ChangeHook] = [log_stage, failover_metrics]
        self.recovery = FailoverRunner(self, sub_master_timeout_s)
        self.resizer = ResizeRunner(self)  # `dlu scale`: requests saved here, run by `run`'s loop
        self.elastic = ElasticResizer(self)  # elastic roles with a MIN:MAX range: shrink and grow
        self.checks = SetupChecks(self)
        self.registry = Registry(self)
        self.debug = DebugTools(self)
        self.liveness = Liveness()
        self.driver = StageDriver(self)  # the stage loop, and what other threads ask of it

    # construction ------------------------------------------------------------------------------
    @classmethod
    def create(
        cls,
        spec: JobSpec,
        scheduler: Scheduler,
        store: StateStore,
        clock: Clock = time.time,
        extension: Extension | None = None,
    ) -> PrimeManager:
        """A new run of the job. Any stored state of an earlier run with this name is replaced,
        so a resubmitted job never picks up a finished job's results.

        Raises:
            SchemaVersionError: the stored state was written by a newer dlu-prime (not replaced).
        """
        existing = store.get(spec.name)
        if existing is not None:
            refuse_newer(spec.name, existing.data)
        manager = cls(
            new_state(spec), scheduler, store, existing.token if existing else None, clock, extension
        )
        manager.apply(
            Note(EventKind.JOB_CREATED, f"job {spec.name} created (run {manager.state.run_id[:8]})")
        )
        return manager

    @classmethod
    def resume(
        cls,
        spec: JobSpec,
        scheduler: Scheduler,
        store: StateStore,
        clock: Clock = time.time,
        extension: Extension | None = None,
    ) -> PrimeManager:
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

    @classmethod
    def self_recover(
        cls,
        spec: JobSpec,
        scheduler: Scheduler,
        store: StateStore,
        clock: Clock = time.time,
        extension: Extension | None = None,
    ) -> PrimeManager | None:
        """Tier 6: a reconstructed PrimeMaster loads the saved state and self-recovers. RUNNING
        resumes monitoring with the actors it finds (healthy workers untouched; an in-flight
        failover is finished by `run`); any other stage, or an error here, stops the job
        safely. None when nothing is stored."""
        stored = store.get(spec.name)
        if stored is None:
            return None
        manager = cls(JobState.loads(stored.data), scheduler, store, stored.token, clock, extension)
        manager.recovery.self_recover()
        return manager

    # the one apply -----------------------------------------------------------------------------
    def apply(self, *changes: Change) -> None:
        """The only code that changes the state: apply each change, save once, then let the hooks
        react to each change with the events it recorded.

        Raises:
            FencedError: another PrimeMaster wrote the state after us.
        """
        with self.lock:
            now = self.clock()
            applied = [(change, apply_change(self.state, change, now)) for change in changes]
            self.save()
            for change, events in applied:
                for hook in self.hooks:
                    try:
                        hook(self, change, events)
                    except Exception:
                        logger.exception("job %s: a state-change hook failed", self.state.job)

    # persistence -------------------------------------------------------------------------------
    @property
    def token(self) -> int | None:
        return self.writer.token

    @property
    def unsaved(self) -> bool:
        return self.writer.unsaved

    def save(self) -> None:
        """Write the whole document (see `StateWriter.save`)."""
        with self.lock:
            self.state.updated_at = self.clock()
            self.writer.save(self.state)

    def flush(self) -> None:
        """Write the state if an earlier save could not reach the store (or recorded its return)."""
        if self.writer.unsaved or self.writer.dirty:
            self.save()

    def _record_unsaved(self, kind: EventKind, message: str, duration_s: float | None) -> None:
        """An event of the state writer itself (a store outage and its end): on the timeline at
        once, so `dlu status` and the console show it; written with the next save."""
        with self.lock:
            self.state.record(kind, message, at=self.clock(), duration_s=duration_s)

    def transition(self, stage: JobStage, reason: str = "", exit_code: int | None = None) -> None:
        """The only place the job's stage changes: check, then apply (saved before anyone acts)."""
        with self.lock:
            current = self.state.stage
            if stage not in ALLOWED[current]:
                raise IllegalTransition(f"{current.value} -> {stage.value}")
            self.apply(StageChanged(stage, reason, exit_code))

    # control from other threads ----------------------------------------------------------------
    def request_stop(self, reason: str = "stopped by user request") -> None:
        self.driver.request_stop(reason)

    def request_stop_failed(self, reason: str) -> None:
        """Stop the job as failed (a limit reached outside the monitoring thread)."""
        self.driver.request_stop_failed(reason)

    @property
    def stop_requested(self) -> bool:
        return self.driver.stop_requested

    def wake(self) -> None:
        """A pushed report (an actor restarted, an error): monitor now instead of at the next tick."""
        self.driver.wake()

    def inject(self, failures: Sequence[Failure]) -> None:
        """Failures reported through the PrimeMaster, judged at the next pass (woken now)."""
        self.driver.inject(failures)

    def record_event(
        self,
        kind: str,
        message: str,
        role: str | None = None,
        tier: str | None = None,
        duration_s: float | None = None,
    ) -> None:
        """An event from a SubMaster (node check verdicts, the end of an in-place restart with
        its duration), saved at once."""
        self.apply(
            Note(EventKind(kind), message, role, tier=Tier(tier) if tier else None, duration_s=duration_s)
        )

    def checkpoint_restored(self, role: str, step: int, source: str, lost_steps: int | None) -> None:
        """A role's ranks resumed checkpoint `step` from `source` after a recovery (reported by
        its rank 0's agent): an event on the timeline (console, `dlu status`) and the lost-steps
        metric."""
        lost = "unknown" if lost_steps is None else str(lost_steps)
        self.apply(
            Note(
                EventKind.CHECKPOINT_RESTORED, f"resumed step {step} from {source}; steps lost: {lost}", role
            )
        )
        if self.metrics is not None and lost_steps:
            self.metrics.lost_steps(role, lost_steps)

    def status(self, events: int = 50, events_after: int | None = None) -> JobStatus:
        """The persisted state plus the live training steps and metrics (kept in memory: not worth a write).

        Never waits on a hung store: while the lock's holder is blocked in a state write (which
        may take the store's whole retry budget), the state is read without the lock, since
        nothing can change it meanwhile (every change holds the lock)."""
        locked = self.lock.acquire(timeout=STATUS_LOCK_WAIT_S)
        while not locked and not self.writer.writing:
            locked = self.lock.acquire(timeout=STATUS_LOCK_WAIT_S)
        try:
            status = self.state.to_status(events, events_after)
            steps = self.liveness.last_steps()
            metrics = self.liveness.last_metrics()
        finally:
            if locked:
                self.lock.release()
        for role in status.roles:
            for actor in role.actors:
                actor.step = steps.get(actor.name)
                actor.metric = metrics.get(actor.name)
        return status

    def steps(self) -> dict[str, int]:
        """The last training step each running actor reported."""
        with self.lock:
            return self.liveness.last_steps()

    # stages (run by `StageDriver`, `stages.py`) -------------------------------------------------
    def run(self) -> None:
        """Drive the job from its current stage to STOPPED (the PrimeMaster's main loop)."""
        self.driver.run()

    def prepare(self) -> None:
        """INIT -> READY: place and create actors, run their self checks and the SubMasters' checks."""
        self.driver.prepare()

    def start(self) -> None:
        """READY -> RUNNING: saved first, then every actor is started (start is idempotent)."""
        self.driver.start()

    def step(self, observations: dict[str, ActorObservation], now: float) -> Assessment:
        """Observations -> judgement (see `StageDriver.step`)."""
        return self.driver.step(observations, now)

    def monitor_once(self) -> Assessment:
        """One pass: poll, judge, apply, then recover (see `StageDriver.monitor_once`)."""
        return self.driver.monitor_once()

    def finish(self, exit_code: int, reason: str) -> None:
        """Any stage -> STOPPING -> STOPPED: stop and remove every actor and placement group."""
        self.driver.finish(exit_code, reason)
