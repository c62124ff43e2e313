"""The job's stages as a loop: INIT -> READY -> RUNNING -> STOPPING -> STOPPED, driven by the
PrimeMaster's thread, and what other threads ask of that loop (stop, look now, judge these).

Every state change still goes through `PrimeManager.apply`/`transition`; this is the order in
which they are asked for. The PrimeManager delegates `run`, `prepare`, `start`, `step`,
`monitor_once`, `finish` and the requests here.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING

from dlu_api.status import JobStage
from dlu_api.vocabulary import ActorStage, EventKind
from dlu_prime.master.changes import ActorsClosed, ActorsPlaced, ActorsStaged, Note, Observed
from dlu_prime.master.elastic_resize import unplaced_elastic
from dlu_prime.master.lifecycle import (
    EXIT_FAILED,
    EXIT_OK,
    EXIT_STOPPED,
    FencedError,
    RestartLimitError,
    start_targets,
)
from dlu_prime.master.monitor import Assessment, Failure, assess
from dlu_prime.master.resize import resizing
from dlu_prime.master.stall_watch import StallWatch
from dlu_prime.scheduler.base import ActorObservation, ActorSetupError, SchedulingError

if TYPE_CHECKING:
    from dlu_prime.master.manager import PrimeManager

logger = logging.getLogger(__name__)


class StageDriver:
    """One per PrimeManager (`manager.driver`); its methods are the manager's of the same names."""

    def __init__(self, manager: PrimeManager) -> None:
        self.m = manager
        self._wake = threading.Event()
        self._stop_request: str | None = None
        self._failed_request: str | None = None
        self._injected: list[Failure] = []  # reports made through the PrimeMaster (dlu debug)
        self.stall = StallWatch()  # "nothing moves": reported, never acted on

    # control from other threads ----------------------------------------------------------------
    def request_stop(self, reason: str) -> None:
        with self.m.lock:
            if self._stop_request is None:
                self._stop_request = reason
        self._wake.set()

    def request_stop_failed(self, reason: str) -> None:
        """Stop the job as failed (a limit reached outside the monitoring thread)."""
        with self.m.lock:
            if self._failed_request is None:
                self._failed_request = reason
        self._wake.set()

    @property
    def stop_requested(self) -> bool:
        return self._stop_request is not None

    def wake(self) -> None:
        """A pushed report (an actor restarted, an error): monitor now instead of at the next tick."""
        self._wake.set()

    def inject(self, failures: Sequence[Failure]) -> None:
        """Failures reported through the PrimeMaster, judged at the next pass (woken now)."""
        with self.m.lock:
            self._injected.extend(failures)
        self._wake.set()

    # stages ------------------------------------------------------------------------------------
    def run(self) -> None:
        """Drive the job from its current stage to STOPPED (the PrimeMaster's main loop)."""
        try:
            if self.m.state.stage is JobStage.INIT:
                self.prepare()
            if self.m.state.stage is JobStage.READY:
                self.start()
            if self.m.state.stage is JobStage.RUNNING:
                self.m.recovery.resume()  # one a previous PrimeMaster saved but did not finish
            while self.m.state.stage is JobStage.RUNNING:
                self.m.flush()
                self.m.resizer.resume()  # a saved `dlu scale` (also one a previous PrimeMaster began)
                self.m.elastic.tick(self.m.clock())
                self.monitor_once()
                if self.m.state.stage is JobStage.RUNNING:
                    self._wake.wait(self.m.state.spec.health.monitor_interval_s)
                    self._wake.clear()
            if self.m.state.stage is JobStage.STOPPING:
                self._finish_stopping()
            self.m.writer.flush_final(self.m.save)
        except FencedError:
            logger.error("job %s: fenced by a newer PrimeMaster; this one stops acting", self.m.state.job)
            raise
        except Exception as exc:
            logger.exception("job %s: PrimeMaster error", self.m.state.job)
            if self.m.state.stage not in (JobStage.STOPPING, JobStage.STOPPED):
                self.finish(EXIT_FAILED, f"PrimeMaster error: {type(exc).__name__}: {exc}")

    def prepare(self) -> None:
        """INIT -> READY: place and create actors, run their self checks and the SubMasters' checks."""
        groups = getattr(self.m.scheduler, "node_groups", None)
        if groups is not None:  # a wait for MIN:MAX nodes is put on the timeline as it begins
            groups.on_wait = lambda message: self.m.apply(Note(EventKind.WAITING_FOR_NODES, message))
        try:
            nodes = self.m.scheduler.prepare()
            placed = Note(EventKind.ACTORS_CREATED, f"{len(nodes)} actor(s) placed")
            self.m.apply(ActorsPlaced(nodes, note=placed), *unplaced_elastic(self.m.state, nodes))
            names = list(self.m.state.actors)
            if self._stop_request is not None:
                self.finish(EXIT_STOPPED, self._stop_request)
                return
            self.m.checks.run(names)
        except SchedulingError as exc:
            self.finish(EXIT_FAILED, f"cannot schedule the job: {exc}")
            return
        except RestartLimitError as exc:
            self.finish(EXIT_FAILED, str(exc))
            return
        except ActorSetupError as exc:
            self.m.apply(ActorsStaged([exc.actor], ActorStage.FAILED, exc.error))
            self.finish(EXIT_FAILED, f"{exc.actor} failed its self check: {exc.error}")
            return
        self.m.apply(ActorsStaged(list(self.m.state.actors), ActorStage.READY))
        self.m.transition(JobStage.READY, "every actor passed its self check")

    def start(self) -> None:
        """READY -> RUNNING: saved first, then every actor is started (start is idempotent)."""
        if self._stop_request is not None:
            self.finish(EXIT_STOPPED, self._stop_request)
            return
        self.m.transition(JobStage.RUNNING, "job started")
        self.m.scheduler.start(start_targets(self.m.state))

    def step(self, observations: dict[str, ActorObservation], now: float) -> Assessment:
        """Observations -> judgement, pure but for the liveness memory it keeps (when each
        actor's beats and steps last moved, on this clock)."""
        live = self.m.liveness
        live.track(observations, now)
        result = assess(self.m.state, observations, now, live.steps, live.unavailable, live.beats)
        with self.m.lock:
            injected, self._injected = self._injected, []
        return replace(result, failures=(*result.failures, *injected)) if injected else result

    def monitor_once(self) -> Assessment:
        """One pass: poll, judge (`step`), apply, then recover (the policy is pure too). Ends the
        job at a limit or when every driver role has finished."""
        if self._failed_request is not None:
            self.finish(EXIT_FAILED, self._failed_request)
            return Assessment()
        if self._stop_request is not None:
            self.finish(EXIT_STOPPED, self._stop_request)
            return Assessment()
        busy = resizing(self.m.state)  # being created or stopped by a resize: not judged
        observations = self.m.scheduler.poll([n for n in self.m.state.actors if n not in busy])
        now = self.m.clock()
        result = self.m.elastic.intercept(self.step(observations, now), observations, now)
        if result.stage_changes or result.node_changes or result.failures or result.errors_seen:
            self.m.apply(Observed(result))
        if self.m.metrics is not None:
            ages = {
                n: now - o.last_heartbeat for n, o in observations.items() if o.last_heartbeat is not None
            }
            self.m.metrics.observe_state(self.m.state, ages)
        if result.failures:
            self.m.recovery.recover(result.failures, observations)
        elif result.all_drivers_finished:
            drivers = ", ".join(r.name for r in self.m.state.spec.roles if r.is_driver)
            self.finish(EXIT_OK, f"every driver role finished ({drivers})")
        else:
            self.stall.check(self.m, observations, now)
        return result

    def finish(self, exit_code: int, reason: str) -> None:
        """Any stage -> STOPPING -> STOPPED: stop and remove every actor and placement group."""
        if self.m.state.stage in (JobStage.STOPPING, JobStage.STOPPED):
            return
        self.m.transition(JobStage.STOPPING, reason, exit_code)
        self._finish_stopping()

    def _finish_stopping(self) -> None:
        """Stop, clean up, then STOPPED even if a step failed: a job left in STOPPING would keep
        its driver waiting forever. A failed step is recorded on the timeline."""
        live = [n for n, a in self.m.state.actors.items() if not a.stage.is_terminal]
        steps: list[tuple[str, EventKind, Callable[[], None]]] = [
            ("stop", EventKind.STOP_FAILED, lambda: self.m.scheduler.stop(live)),
            ("cleanup", EventKind.CLEANUP_FAILED, self.m.scheduler.cleanup),
        ]
        for step, kind, call in steps:
            try:
                call()
            except Exception as exc:
                logger.exception("job %s: %s failed", self.m.state.job, step)
                self.m.apply(Note(kind, f"{type(exc).__name__}: {exc}"))
        self.m.apply(ActorsClosed())
        self.m.transition(JobStage.STOPPED)
        self.m.writer.retain(self.m.state.job)
