"""PrimeManager: the job's stage machine as one loop around one pure decision core.

INIT -> READY -> RUNNING -> STOPPING -> STOPPED. Each input (a monitoring pass, a SubMaster's
restart request, a rank's in-place report, a stop, a rebuilt PrimeMaster, the outcome of a
command) is an event: `core.decide` turns it, with the recorded state, into changes and
commands; `apply` changes the state and saves it (compare-and-set) before anything acts on it;
the executor runs the commands outside the lock (so `status` never waits on them) and each
outcome is decided in turn. A multi-step recovery is a chain of such decisions, and a
reconstructed PrimeMaster resumes it from the saved state. A lost compare-and-set means another
PrimeMaster owns the job and this one must stop touching it.

Around it: `executor.py` runs the commands, `monitoring.py` observes a monitoring pass,
`resizer.py` takes `dlu scale` requests (the resize chain is the core's), `registry.py` the
endpoints and channels, `debug.py` what `dlu debug` needs, `keeper.py` the one apply (each
change, its write, the hooks that react), `persistence.py` the store writes, `hooks.py` what
reacts to changes (the log, metrics), `construction.py` a new, resumed or
rebuilt PrimeManager, `stop_requests.py` stops asked on other threads, `reports.py` what
SubMasters only tell, `status_view.py` a status that never waits on a hung store.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from typing import Any

from dlu_api.spec.models import JobSpec
from dlu_api.status import JobStage, JobStatus
from dlu_api.vocabulary import EventKind, InPlaceDecision
from dlu_prime.extension import Extension
from dlu_prime.master import construction
from dlu_prime.master.changes import Change, Note
from dlu_prime.master.core.events import (
    Event,
    InPlaceReported,
    PrepareRequested,
    RestartRequested,
    StartRequested,
    StopRequested,
    Tick,
)
from dlu_prime.master.debug import DebugTools
from dlu_prime.master.executor import SUB_MASTER_FAILOVER_TIMEOUT_S, Callbacks, Executor
from dlu_prime.master.keeper import StateKeeper
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
    sub_masters,
)
from dlu_prime.master.loop import DecisionLoop
from dlu_prime.master.metrics import JobMetrics
from dlu_prime.master.monitor import Assessment, Failure
from dlu_prime.master.monitoring import Monitoring
from dlu_prime.master.ports import StatePort
from dlu_prime.master.registry import Registry
from dlu_prime.master.reports import Reports
from dlu_prime.master.resize import ResizePlan
from dlu_prime.master.resizer import ResizeRunner
from dlu_prime.master.state import JobState
from dlu_prime.master.status_view import live_status
from dlu_prime.master.stop_requests import StopRequests
from dlu_prime.scheduler.base import ActorObservation, Scheduler
from dlu_prime.state.base import StateStore

logger = logging.getLogger(__name__)

Clock = Callable[[], float]

__all__ = [
    "ALLOWED",
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
        sleep: Callable[[float], None] | None = None,
    ) -> None:
        self.state = state
        self.scheduler = scheduler
        self.clock = clock
        self.metrics: JobMetrics | None = None  # set by the PrimeMaster actor (Ray metrics)
        self.keeper = keeper = StateKeeper(self, store, token, clock, self.wake)  # the one apply
        self.lock, self.writer, self.hooks = keeper.lock, keeper.writer, keeper.hooks
        port = StatePort(lambda: self.state, self.lock, keeper.apply, keeper.save, self.wake, keeper.atomic)
        self.monitoring = Monitoring(
            port, scheduler, clock, self.handle, lambda: self.extension is not None, lambda: self.metrics
        )
        self.liveness = self.monitoring.liveness
        self.hooks.append(lambda _, change, __: self.monitoring.autoscale.on_change(self.state, change))
        self.elastic = self.monitoring.elastic  # elastic roles: what a pass sees of their nodes
        self._wake = threading.Event()
        self.stops = StopRequests(self.lock, self._wake.set)  # asked on other threads, taken by the loop
        callbacks = Callbacks(
            self.liveness.forget, self.stops.ask, self.wake, lambda: sub_masters(self.state)
        )
        # A clock that can sleep (a simulated one) governs the executor's waits too.
        wait = sleep or getattr(clock, "sleep", None) or time.sleep
        self.executor = Executor(scheduler, callbacks, extension, clock, sub_master_timeout_s, wait)
        self.loop = DecisionLoop(
            port,
            self.executor.run,
            clock,
            lambda: self.stops.user,
            lambda: self.writer.retain(self.state.job),
        )
        self.resizer = ResizeRunner(port, self.handle)  # `dlu scale`: decided at once, run by the loop
        self.registry = Registry(port)
        self.debug = DebugTools(port, self.inject, self.steps)
        self.reports = Reports(port, lambda: self.metrics)

    @property
    def extension(self) -> Extension | None:
        """The Extension that relaunches nodes (tier 4); the executor's port to it."""
        return self.executor.extension

    @extension.setter
    def extension(self, extension: Extension | None) -> None:
        self.executor.extension = extension

    # construction (`construction.py`) -------------------------------------------------------
    @classmethod
    def create(
        cls,
        spec: JobSpec,
        scheduler: Scheduler,
        store: StateStore,
        clock: Clock = time.time,
        extension: Extension | None = None,
    ) -> PrimeManager:
        """A new run of the job (see `construction.create`).

        Raises:
            SchemaVersionError: the stored state was written by a newer dlu-prime (not replaced).
        """
        return construction.create(cls, spec, scheduler, store, clock, extension)

    @classmethod
    def resume(
        cls,
        spec: JobSpec,
        scheduler: Scheduler,
        store: StateStore,
        clock: Clock = time.time,
        extension: Extension | None = None,
    ) -> PrimeManager:
        """A job-level restart of a stored job (see `construction.resume`).

        Raises:
            ResumeError: nothing stored, the job already succeeded, or a restart limit is used up.
        """
        return construction.resume(cls, spec, scheduler, store, clock, extension)

    @classmethod
    def self_recover(
        cls,
        spec: JobSpec,
        scheduler: Scheduler,
        store: StateStore,
        clock: Clock = time.time,
        extension: Extension | None = None,
    ) -> PrimeManager | None:
        """Tier 6: a reconstructed PrimeMaster loads the saved state and self-recovers (see
        `construction.self_recover`). None when nothing is stored."""
        return construction.self_recover(cls, spec, scheduler, store, clock, extension)

    # the state: changed, written and reacted to by the keeper (`keeper.py`) ---------------
    def apply(self, *changes: Change) -> None:
        """Apply the changes, save once, then run the hooks (`StateKeeper.apply`).

        Raises:
            FencedError: another PrimeMaster wrote the state after us.
        """
        self.keeper.apply(*changes)

    def atomic(self) -> AbstractContextManager[None]:
        """Every change applied inside is saved in one write at the end (`StateKeeper.atomic`)."""
        return self.keeper.atomic()

    def save(self) -> None:
        """Write the whole document (see `StateWriter.save`)."""
        self.keeper.save()

    def flush(self) -> None:
        """Write the state if an earlier save could not reach the store (or recorded its return)."""
        self.keeper.flush()

    def transition(self, stage: JobStage, reason: str = "", exit_code: int | None = None) -> None:
        """The only place the job's stage changes: check, then apply (saved before anyone acts)."""
        self.keeper.transition(stage, reason, exit_code)

    @property
    def token(self) -> int | None:
        return self.writer.token

    @property
    def unsaved(self) -> bool:
        return self.writer.unsaved

    # the loop: event -> decide -> apply -> execute -> outcome ---------------------------------
    def handle(self, event: Event) -> Any:
        """Decide `event` and every outcome that follows, to the end of its chain (`loop.py`).
        Returns the answer for a caller on another thread, or raises its error."""
        return self.loop.handle(event)

    # control from other threads ----------------------------------------------------------------
    def request_stop(self, reason: str = "stopped by user request") -> None:
        """Stop the job: decided by its loop at its next step (woken now)."""
        self.stops.request(reason)

    def request_stop_failed(self, reason: str) -> None:
        """Stop the job as failed (a limit reached outside the monitoring thread)."""
        self.stops.request_failed(reason)

    @property
    def stop_requested(self) -> bool:
        return self.stops.user is not None

    def wake(self) -> None:
        """A pushed report (an actor restarted, an error): monitor now instead of at the next tick."""
        self._wake.set()

    def inject(self, failures: Sequence[Failure]) -> None:
        """Failures reported through the PrimeMaster, judged at the next pass (woken now)."""
        self.monitoring.inject(failures)
        self._wake.set()

    def restart_actors(self, names: list[str], reason: str) -> None:
        """Replace actors of one or more roles (asked by a SubMaster): counted, limited and saved
        before the scheduler acts. A failover that asks for it was counted already.

        Raises:
            KeyError: an unknown actor.
            RestartLimitError: a role would exceed its max_restart; nothing was restarted.
        """
        self.handle(RestartRequested(tuple(names), reason))

    def note_inplace_restart(
        self,
        role: str,
        message: str,
        agent: str | None = None,
        error: str = "",
        recovered: bool = False,
        report_id: str | None = None,
    ) -> InPlaceDecision:
        """A SubMaster's rank `agent` failed its training process: its own fault (tier 1,
        counted), the effect of a peer's fault being handled (joined), or over the limit (the
        job stops). See `failover.judge_inplace`. A `report_id` judged before is answered from
        its saved decision (the SubMaster's retry), never counted twice."""
        report = InPlaceReported(role, agent, message, error, recovered, report_id)
        decision: InPlaceDecision = self.handle(report)
        return decision

    def request_scale(
        self, role: str, size: int, cause: str = "dlu scale", request_id: str | None = None
    ) -> ResizePlan:
        """`dlu scale` (or an auto-scaling policy): decided and saved in flight at once, carried
        out by the loop (the core's resize chain; see `ResizeRunner.request`).

        Raises:
            ScaleError: refused (the message names the value and the fix); nothing changed.
        """
        return self.resizer.request(role, size, cause, request_id)

    def mark_unhealthy(self, names: list[str], message: str, request_id: str | None = None) -> bool:
        """These actors count as having reported an error, judged at the next pass (at most once
        per `request_id`). Returns whether they were marked now."""
        return self.debug.mark_unhealthy(names, message, request_id)

    def record_event(
        self,
        kind: str,
        message: str,
        role: str | None = None,
        tier: str | None = None,
        duration_s: float | None = None,
    ) -> None:
        """An event from a SubMaster, saved at once (`Reports.record_event`)."""
        self.reports.record_event(kind, message, role, tier, duration_s)

    def checkpoint_restored(self, role: str, step: int, source: str, lost_steps: int | None) -> None:
        """A role's ranks resumed a checkpoint after a recovery (`Reports.checkpoint_restored`)."""
        self.reports.checkpoint_restored(role, step, source, lost_steps)

    def status(self, events: int = 50, events_after: int | None = None) -> JobStatus:
        """The persisted state plus the live training steps and metrics; never waits on a hung
        store (`status_view.live_status`)."""
        status = live_status(self.state, self.lock, self.writer, self.liveness, events, events_after)
        return self.monitoring.autoscale.status(status)

    def steps(self) -> dict[str, int]:
        """The last training step each running actor reported."""
        with self.lock:
            return self.liveness.last_steps()

    # stages ------------------------------------------------------------------------------------
    def run(self) -> None:
        """Drive the job from its current stage to STOPPED (the PrimeMaster's main loop)."""
        try:
            if self.state.stage is JobStage.INIT:
                self.prepare()
            if self.state.stage is JobStage.READY:
                self.start()
            if self.state.stage is JobStage.RUNNING:
                self.resume_in_flight()
            while self.state.stage is JobStage.RUNNING:
                self.flush()
                self.resizer.resume()  # a saved `dlu scale` (also one a previous PrimeMaster began)
                self.elastic.tick(self.clock())
                self.monitor_once()
                if self.state.stage is JobStage.RUNNING:
                    self._wake.wait(self.state.spec.health.monitor_interval_s)
                    self._wake.clear()
            if self.state.stage is JobStage.STOPPING:
                self.handle(Tick())  # the rest of a stop
            self.writer.flush_final(self.save)
        except FencedError:
            logger.error("job %s: fenced by a newer PrimeMaster; this one stops acting", self.state.job)
            raise
        except Exception as exc:
            logger.exception("job %s: PrimeMaster error", self.state.job)
            if self.state.stage not in (JobStage.STOPPING, JobStage.STOPPED):
                self.finish(EXIT_FAILED, f"PrimeMaster error: {type(exc).__name__}: {exc}")

    def resume_in_flight(self) -> None:
        """Finish what the saved state has in flight: a recovery a previous PrimeMaster began
        (from its first step: each is idempotent), or the rest of a stop."""
        self.handle(Tick())

    def prepare(self) -> None:
        """INIT -> READY: place and create actors, run their self checks and the SubMasters' checks."""
        groups = getattr(self.scheduler, "node_groups", None)
        if groups is not None:  # a wait for MIN:MAX nodes is put on the timeline as it begins
            groups.on_wait = self._waiting_for_nodes
        self.handle(PrepareRequested())

    def _waiting_for_nodes(self, message: str) -> None:
        self.apply(Note(EventKind.WAITING_FOR_NODES, message))

    def start(self) -> None:
        """READY -> RUNNING: saved first, then every actor is started (start is idempotent)."""
        self.handle(StartRequested(self.stops.user))

    def step(self, observations: dict[str, ActorObservation], now: float) -> Assessment:
        """Observations -> judgement (see `Monitoring.step`)."""
        return self.monitoring.step(observations, now)

    def monitor_once(self) -> Assessment:
        """One pass (`Monitoring.once`), unless a stop was asked for on another thread."""
        stop = self.stops.pending()
        if stop is not None:
            self.handle(stop)
            return Assessment()
        return self.monitoring.once()

    def finish(self, exit_code: int, reason: str) -> None:
        """Any stage -> STOPPING -> STOPPED: stop and remove every actor and placement group."""
        self.handle(StopRequested(exit_code, reason))
