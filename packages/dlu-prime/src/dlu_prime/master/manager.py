"""PrimeManager: the job's stage machine. The one place where the job's state changes.

INIT -> READY -> RUNNING -> STOPPING -> STOPPED. Every change is saved to the state store
(compare-and-set) before the manager acts on it, so a reconstructed PrimeMaster resumes from
exactly what this one had decided; a lost compare-and-set means another PrimeMaster owns the
job and this one must stop touching it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import replace

from dlu_api.spec.models import JobSpec
from dlu_api.status import JobStage, JobStatus
from dlu_prime.extension import Extension, NodeInfo
from dlu_prime.master.failover import (
    DEATH_KINDS,
    FailoverPlan,
    InPlaceDecision,
    InPlaceVerdict,
    Recovery,
    job_restart,
    judge_inplace,
    plan_failover,
    setup_retry,
)
from dlu_prime.master.metrics import JobMetrics
from dlu_prime.master.monitor import Assessment, Failure, assess, track_beats, track_steps, track_unavailable
from dlu_prime.master.state import (
    SUB_MASTER_RANK,
    ActorRecord,
    ActorStage,
    ChannelRecord,
    FailoverRecord,
    JobState,
    RoleRecord,
    Tier,
    close_actors,
)
from dlu_prime.naming import sub_master_name
from dlu_prime.roles import sub_master_path
from dlu_prime.scheduler.base import ActorObservation, ActorSetupError, Scheduler, SchedulingError
from dlu_prime.scheduler.placement import plan_placement
from dlu_prime.state.base import (
    StateConflictError,
    StateStore,
    StateStoreError,
    StateStoreUnavailableError,
)

logger = logging.getLogger(__name__)

Clock = Callable[[], float]

ALLOWED: dict[JobStage, frozenset[JobStage]] = {
    JobStage.INIT: frozenset({JobStage.READY, JobStage.STOPPING}),
    JobStage.READY: frozenset({JobStage.RUNNING, JobStage.STOPPING}),
    JobStage.RUNNING: frozenset({JobStage.INIT, JobStage.STOPPING}),
    JobStage.STOPPING: frozenset({JobStage.STOPPED}),
    JobStage.STOPPED: frozenset(),
    JobStage.LOST: frozenset(),  # a client's reading of a local job whose process died; never entered
}

FINAL_SAVE_PATIENCE_S = 120.0
EXIT_OK = 0
EXIT_FAILED = 1
EXIT_STOPPED = 130


class FencedError(Exception):
    """Another PrimeMaster wrote the job's state after us: this one must stop acting."""


class ResumeError(Exception):
    """A stored job cannot be resumed; the message says why."""


class RestartLimitError(Exception):
    """A restart would exceed a limit; the message names the limit and the culprit."""


class IllegalTransition(Exception):
    """A stage change the machine does not allow (a bug, never user input)."""


def new_state(spec: JobSpec) -> JobState:
    """A fresh state with a record for every role and actor of the placement plan."""
    state = JobState(spec=spec)
    for role in spec.roles:
        state.roles[role.name] = RoleRecord(name=role.name)
    for plan in plan_placement(spec).actors:
        state.actors[plan.name] = ActorRecord(name=plan.name, role=plan.role, rank=plan.rank)
    for role in spec.roles:
        if sub_master_path(role) is not None:
            name = sub_master_name(spec.name, role.name)
            state.actors[name] = ActorRecord(name=name, role=role.name, rank=SUB_MASTER_RANK)
    return state


def resume_problem(spec: JobSpec, old: JobState | None) -> str | None:
    """Why a stored job cannot be resumed, or None if it can."""
    if old is None:
        return f"job {spec.name}: no stored state in store {spec.state_store.name!r} to resume"
    if old.stage is JobStage.STOPPED and old.exit_code == EXIT_OK:
        return f"job {spec.name} already finished successfully; submit it as a new job"
    limit = spec.limits.job_max_restart
    if old.job_restart_count + 1 > limit:
        return (
            f"job {spec.name}: job_max_restart={limit} reached ({old.job_restart_count} restarts); "
            "raise limits.job_max_restart to resume it"
        )
    return None


def _gone(seen: ActorObservation) -> bool:
    """Dead, being rebuilt by Ray, or rebuilt and not set up yet: a fault to be handled."""
    return seen.stage is None or (seen.reconstructed and seen.stage is ActorStage.INIT)


def sub_masters(state: JobState) -> list[str]:
    return [n for n, a in state.actors.items() if a.rank == SUB_MASTER_RANK]


def start_targets(state: JobState) -> list[str]:
    """Who the PrimeManager starts: SubMasters, and the workers of roles without one."""
    driven = {a.role for a in state.actors.values() if a.rank == SUB_MASTER_RANK}
    return [n for n, a in state.actors.items() if a.rank == SUB_MASTER_RANK or a.role not in driven]


class PrimeManager:
    def __init__(
        self,
        state: JobState,
        scheduler: Scheduler,
        store: StateStore,
        token: int | None,
        clock: Clock = time.time,
        extension: Extension | None = None,
    ) -> None:
        self.state = state
        self.scheduler = scheduler
        self.store = store
        self.token = token
        self.clock = clock
        self.extension = extension
        self._lock = threading.RLock()
        self._wake = threading.Event()
        self._stop_request: str | None = None
        self._failed_request: str | None = None
        self._steps: dict[str, tuple[int, float]] = {}
        self._beats: dict[str, tuple[int, float]] = {}
        self._unavailable: dict[str, float] = {}
        self._injected: list[Failure] = []  # reports made through the PrimeMaster (dlu debug)
        self.metrics: JobMetrics | None = None  # set by the PrimeMaster actor (Ray metrics)
        self.unsaved = False  # the last save could not reach the store

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
        so a resubmitted job never picks up a finished job's results."""
        existing = store.get(spec.name)
        manager = cls(
            new_state(spec), scheduler, store, existing.token if existing else None, clock, extension
        )
        manager.state.record(
            "job_created", f"job {spec.name} created (run {manager.state.run_id[:8]})", at=clock()
        )
        manager.save()
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
        limit = spec.limits.job_max_restart
        state = new_state(spec)
        state.job_restart_count = old.job_restart_count + 1
        state.global_restart_count = old.global_restart_count
        state.master_restart_count = old.master_restart_count
        state.node_restart_count = old.node_restart_count
        state.removed_nodes = list(old.removed_nodes)
        state.node_failures = dict(old.node_failures)
        for name, record in old.roles.items():
            if name in state.roles:
                state.roles[name].restart_count = record.restart_count
        state.events = list(old.events)
        manager = cls(state, scheduler, store, stored.token, clock, extension)
        state.record(
            "job_resumed",
            f"job {spec.name} resumed (restart {state.job_restart_count}/{limit}) after stage "
            f"{old.stage.value}: {old.reason.splitlines()[0] if old.reason else 'no reason recorded'}",
            at=clock(),
        )
        manager.save()
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
        state = JobState.loads(stored.data)
        manager = cls(state, scheduler, store, stored.token, clock, extension)
        state.master_restart_count += 1
        in_flight = f"; {state.failover.tier.value} failover in flight" if state.failover else ""
        state.record(
            "master_restarted",
            f"PrimeMaster reconstructed in stage {state.stage.value}{in_flight} "
            f"({state.master_restart_count}/{spec.limits.master_max_restart})",
            tier=Tier.MASTER,
            at=clock(),
        )
        manager.save()
        limit = spec.limits.master_max_restart
        try:
            if state.master_restart_count > limit and state.stage is not JobStage.STOPPED:
                manager.finish(
                    EXIT_FAILED,
                    f"master_max_restart={limit} reached ({state.master_restart_count} PrimeMaster restarts)",
                )
            elif state.stage is JobStage.RUNNING:
                # Actors saved READY were never started if the crash fell between save and start;
                # those of an in-flight failover are the failover's to start.
                busy = set(state.failover.actors) if state.failover else set[str]()
                unstarted = [
                    n
                    for n, a in state.actors.items()
                    if a.stage is ActorStage.READY and n not in busy and n in start_targets(state)
                ]
                if unstarted:
                    scheduler.start(unstarted)
            elif state.stage is not JobStage.STOPPED:
                manager.finish(
                    EXIT_FAILED,
                    f"PrimeMaster restarted during {state.stage.value}, a short-lived stage; stopped safely",
                )
        except (FencedError, IllegalTransition):
            raise
        except Exception as exc:
            logger.exception("job %s: self-recovery failed", spec.name)
            manager.finish(EXIT_FAILED, f"PrimeMaster self-recovery failed: {type(exc).__name__}: {exc}")
        return manager

    # persistence -----------------------------------------------------------------------------
    def save(self) -> None:
        """Compare-and-set the document; losing means we are fenced.

        If the store is unreachable the job keeps running on the in-memory state, which is
        written (whole, so never an older version over a newer one) as soon as it is back.
        """
        with self._lock:
            self.state.updated_at = self.clock()
            try:
                self.token = self.store.put(self.state.job, self.state.dumps(), self.token)
            except StateConflictError as exc:
                raise FencedError(
                    f"job {self.state.job}: state was written by another PrimeMaster ({exc})"
                ) from exc
            except StateStoreUnavailableError as exc:
                if not self.unsaved:
                    logger.warning("job %s: state store unavailable, running on (%s)", self.state.job, exc)
                self.unsaved = True
                return
            if self.unsaved:
                logger.info("job %s: state store back; latest state written", self.state.job)
            self.unsaved = False

    def flush(self) -> None:
        """Write the state if an earlier save could not reach the store."""
        if self.unsaved:
            self.save()

    def _flush_final(self, patience_s: float = FINAL_SAVE_PATIENCE_S) -> None:
        """The job ended while the store was away: keep trying, so its end is not lost."""
        deadline = time.monotonic() + patience_s
        delay = 0.2
        while self.unsaved and time.monotonic() < deadline:
            time.sleep(delay)
            delay = min(delay * 2, 5.0)
            self.flush()
        if self.unsaved:
            logger.error("job %s: final state could not be written to the store", self.state.job)

    def transition(self, stage: JobStage, reason: str = "", exit_code: int | None = None) -> None:
        """The only place the job's stage changes: check, record, save, then return to act."""
        with self._lock:
            current = self.state.stage
            if stage not in ALLOWED[current]:
                raise IllegalTransition(f"{current.value} -> {stage.value}")
            self.state.stage = stage
            if reason:
                self.state.reason = reason
            if exit_code is not None:
                self.state.exit_code = exit_code
            message = f"{current.value} -> {stage.value}" + (f": {reason.splitlines()[0]}" if reason else "")
            self.state.record("stage", message, at=self.clock())
            self.save()
        logger.info("job %s: %s", self.state.job, message)

    # control from other threads --------------------------------------------------------------
    def request_stop(self, reason: str = "stopped by user request") -> None:
        with self._lock:
            if self._stop_request is None:
                self._stop_request = reason
        self._wake.set()

    @property
    def stop_requested(self) -> bool:
        return self._stop_request is not None

    def wake(self) -> None:
        """A pushed report (an actor restarted, an error): monitor now instead of at the next tick."""
        self._wake.set()

    def status(self, events: int = 50) -> JobStatus:
        """The persisted state plus the live training steps (kept in memory: not worth a write)."""
        with self._lock:
            status = self.state.to_status(events)
            steps = {name: step for name, (step, _) in self._steps.items()}
        for role in status.roles:
            for actor in role.actors:
                actor.step = steps.get(actor.name)
        return status

    def register_channel(self, name: str, kind: str, actor_name: str) -> None:
        with self._lock:
            if name in self.state.channels:
                return
            self.state.channels[name] = ChannelRecord(name=name, kind=kind, actor_name=actor_name)
            self.state.record("channel_created", f"{kind} {name!r} created", at=self.clock())
            self.save()

    def publish(self, key: str, value: dict[str, str]) -> None:
        """Record an endpoint (saved, so restarted workers find a restarted SubMaster)."""
        with self._lock:
            if self.state.endpoints.get(key) == value:
                return
            self.state.endpoints[key] = dict(value)
            self.state.record("endpoint", f"{key} published at {value.get('address', '?')}", at=self.clock())
            self.save()

    def restart_actors(self, names: list[str], reason: str) -> None:
        """Replace actors of one or more roles (asked by a SubMaster): counted, limited and saved
        before the scheduler acts.

        Raises:
            RestartLimitError: a role would exceed its max_restart; nothing was restarted.
        """
        with self._lock:
            unknown = [n for n in names if n not in self.state.actors]
            if unknown:
                raise KeyError(f"no such actor(s): {', '.join(unknown)}")
            # A failover that asks for it (through a SubMaster) was already counted and saved.
            in_flight = self.state.failover
            counted_already = in_flight is not None and set(names) <= set(in_flight.actors)
            roles = sorted({self.state.actors[n].role for n in names})
            for role in roles if not counted_already else []:
                limit = self.state.spec.role(role).max_restart
                if self.state.roles[role].restart_count + 1 > limit:
                    raise RestartLimitError(
                        f"role {role} reached max_restart={limit} (restarting {', '.join(names)}: {reason})"
                    )
            for role in roles if not counted_already else []:
                self.state.roles[role].restart_count += 1
            for name in names:
                record = self.state.actors[name]
                if not counted_already:
                    record.restart_count += 1
                record.stage = ActorStage.INIT
            self.state.record("actors_restarting", f"{', '.join(names)}: {reason}", at=self.clock())
            self.save()
        nodes = self.scheduler.restart(names)
        with self._lock:
            for name, node in nodes.items():
                self.state.actors[name].node_id = node
                self.state.actors[name].stage = ActorStage.READY
                self.state.actors[name].errors_seen = 0
            self.state.record(
                "actors_restarted", f"{len(names)} actor(s) replaced and ready", at=self.clock()
            )
            self.save()

    def record_event(self, kind: str, message: str, role: str | None = None) -> None:
        """An event from a SubMaster (node check verdicts, in-place restarts), saved at once."""
        with self._lock:
            self.state.record(kind, message, role=role, at=self.clock())
            self.save()

    def worker_names(self, role: str, rank: int | None = None) -> list[str]:
        """A role's workers (or one rank), for debugging calls.

        Raises:
            ValueError: no such role or rank.
        """
        with self._lock:
            known = [r.name for r in self.state.spec.roles]
            if role not in known:
                raise ValueError(f"job {self.state.job} has no role {role!r}; roles: {', '.join(known)}")
            names = [
                n
                for n, a in sorted(self.state.actors.items(), key=lambda item: item[1].rank)
                if a.role == role and a.rank != SUB_MASTER_RANK and (rank is None or a.rank == rank)
            ]
        if not names:
            raise ValueError(f"role {role} has no rank {rank}")
        return names

    def mark_unhealthy(self, names: list[str], message: str) -> None:
        """The health seed's mark-unhealthy endpoint: these actors count as having reported an
        error, judged at the next monitoring pass (woken now)."""
        with self._lock:
            for name in names:
                record = self.state.actors[name]
                self._injected.append(Failure(name, record.role, "error_report", message, record.node_id))
        self._wake.set()

    def steps(self) -> dict[str, int]:
        """The last training step each running actor reported."""
        with self._lock:
            return {name: step for name, (step, _) in self._steps.items()}

    def lookup(self, key: str) -> dict[str, str] | None:
        with self._lock:
            found = self.state.endpoints.get(key)
            return dict(found) if found is not None else None

    # stages ----------------------------------------------------------------------------------
    def run(self) -> None:
        """Drive the job from its current stage to STOPPED (the PrimeMaster's main loop)."""
        try:
            if self.state.stage is JobStage.INIT:
                self.prepare()
            if self.state.stage is JobStage.READY:
                self.start()
            if self.state.stage is JobStage.RUNNING:
                self.resume_failover()  # one a previous PrimeMaster saved but did not finish
            while self.state.stage is JobStage.RUNNING:
                self.flush()
                self.monitor_once()
                if self.state.stage is JobStage.RUNNING:
                    self._wake.wait(self.state.spec.health.monitor_interval_s)
                    self._wake.clear()
            if self.state.stage is JobStage.STOPPING:
                self._finish_stopping()
            self._flush_final()
        except FencedError:
            logger.error("job %s: fenced by a newer PrimeMaster; this one stops acting", self.state.job)
            raise
        except Exception as exc:
            logger.exception("job %s: PrimeMaster error", self.state.job)
            if self.state.stage not in (JobStage.STOPPING, JobStage.STOPPED):
                self.finish(EXIT_FAILED, f"PrimeMaster error: {type(exc).__name__}: {exc}")

    def _actor_names(self) -> list[str]:
        return list(self.state.actors)

    def prepare(self) -> None:
        """INIT -> READY: place and create actors, run their self checks and the SubMasters' checks."""
        names = self._actor_names()
        try:
            nodes = self.scheduler.prepare()
            with self._lock:
                for name, node in nodes.items():
                    if name in self.state.actors:
                        self.state.actors[name].node_id = node
                self.state.record("actors_created", f"{len(nodes)} actor(s) placed", at=self.clock())
                self.save()
            if self._stop_request is not None:
                self.finish(EXIT_STOPPED, self._stop_request)
                return
            self._check(names)
        except SchedulingError as exc:
            self.finish(EXIT_FAILED, f"cannot schedule the job: {exc}")
            return
        except RestartLimitError as exc:
            self.finish(EXIT_FAILED, str(exc))
            return
        except ActorSetupError as exc:
            with self._lock:
                record = self.state.actors.get(exc.actor)
                if record is not None:
                    record.stage = ActorStage.FAILED
                    record.error = exc.error
            self.finish(EXIT_FAILED, f"{exc.actor} failed its self check: {exc.error}")
            return
        with self._lock:
            for record in self.state.actors.values():
                record.stage = ActorStage.READY
        self.transition(JobStage.READY, "every actor passed its self check")

    def _check(self, names: list[str]) -> None:
        """Self checks, then the SubMasters' checks (e.g. a node check). An actor that died
        under them and that Ray rebuilt is checked again, counted on its role's budget.

        Raises:
            ActorSetupError: a check failed.
            RestartLimitError: an actor kept dying and its role's budget is used up.
        """
        pending = names
        counted: dict[str, str | None] = {}  # actor -> the incarnation its last counted death gave
        while True:
            try:
                if pending:
                    self.scheduler.setup(pending)
                self.scheduler.check_children(sub_masters(self.state))
                return
            except ActorSetupError as exc:
                if not exc.transient or exc.actor not in self.state.actors:
                    raise
                incarnation = self._await_incarnation(exc.actor)
                if exc.actor in counted and incarnation is not None and counted[exc.actor] == incarnation:
                    # The same process answers: the call failed while Ray was still rebuilding it
                    # (or on a blip), not because it died again. Not another fault.
                    pending = [exc.actor]
                    continue
                recovery, stop = setup_retry(self.state, exc.actor, exc.error)
                if recovery is None:
                    raise RestartLimitError(stop or exc.error) from None
                self._note_setup_retry(recovery)
                counted[exc.actor] = incarnation
                pending = [exc.actor]

    def _await_incarnation(self, name: str) -> str | None:
        """Which process of `name` answers once Ray has rebuilt it; None if none answers within
        the heartbeat timeout (or it is gone for good)."""
        deadline = time.monotonic() + self.state.spec.health.heartbeat_timeout_s
        while True:
            seen = self.scheduler.poll([name]).get(name)
            if seen is not None and seen.stage is not None:
                return seen.incarnation
            if seen is not None and not seen.unavailable and "no longer exists" in (seen.error or ""):
                return None
            if time.monotonic() >= deadline:
                return None
            time.sleep(0.1)

    def _note_setup_retry(self, recovery: Recovery) -> None:
        with self._lock:
            self._count(recovery)
            now = self.clock()
            role, actor, tier = recovery.role, recovery.culprit, recovery.tier
            started = f"{tier.value} failover: {recovery.reason}"
            self.state.record("failover_started", started, role=role, actor=actor, tier=tier, at=now)
            done = f"{actor} set up again"
            self.state.record(
                "failover_done", done, role=role, actor=actor, tier=tier, duration_s=0.0, at=now
            )
            self.save()

    def start(self) -> None:
        """READY -> RUNNING: saved first, then every actor is started (start is idempotent)."""
        if self._stop_request is not None:
            self.finish(EXIT_STOPPED, self._stop_request)
            return
        self.transition(JobStage.RUNNING, "job started")
        self.scheduler.start(start_targets(self.state))

    def monitor_once(self) -> Assessment:
        """One pass: poll, judge (pure), apply, then recover (policy is pure too). Ends the job at
        a limit or when every driver role has finished."""
        if self._failed_request is not None:
            self.finish(EXIT_FAILED, self._failed_request)
            return Assessment()
        if self._stop_request is not None:
            self.finish(EXIT_STOPPED, self._stop_request)
            return Assessment()
        observations = self.scheduler.poll(self._actor_names())
        now = self.clock()
        self._steps = track_steps(self._steps, observations, now)
        self._beats = track_beats(self._beats, observations, now)
        self._unavailable = track_unavailable(self._unavailable, observations, now)
        result = assess(self.state, observations, now, self._steps, self._unavailable, self._beats)
        with self._lock:
            injected, self._injected = self._injected, []
        if injected:
            result = replace(result, failures=(*result.failures, *injected))
        self._apply(result)
        if self.metrics is not None:
            ages = {
                n: now - o.last_heartbeat for n, o in observations.items() if o.last_heartbeat is not None
            }
            self.metrics.observe_state(self.state, ages)
        if result.failures:
            self.recover(result.failures, observations)
        elif result.all_drivers_finished:
            drivers = ", ".join(r.name for r in self.state.spec.roles if r.is_driver)
            self.finish(EXIT_OK, f"every driver role finished ({drivers})")
        return result

    def _apply(self, result: Assessment) -> None:
        if not (result.stage_changes or result.node_changes or result.failures or result.errors_seen):
            return
        with self._lock:
            now = self.clock()
            for name, node in result.node_changes.items():
                self.state.actors[name].node_id = node
            for name, stage in result.stage_changes.items():
                self.state.actors[name].stage = stage
            for name, count in result.errors_seen.items():
                self.state.actors[name].errors_seen = count
            for failure in result.failures:
                record = self.state.actors[failure.actor]
                record.total_failures += 1
                record.error = failure.message
                if failure.kind in ("died", "restarted", "unavailable"):
                    record.stage = ActorStage.FAILED
                self.state.record(
                    failure.kind,
                    failure.message.strip().splitlines()[-1] if failure.message.strip() else failure.kind,
                    role=failure.role,
                    actor=failure.actor,
                    node_id=failure.node_id,
                    at=now,
                )
            for role in result.finished_roles:
                if not any(e.kind == "role_finished" and e.role == role for e in self.state.events):
                    self.state.record("role_finished", "every actor finished", role=role, at=now)
            self.save()

    # failover ----------------------------------------------------------------------------------
    def recover(
        self,
        failures: tuple[Failure, ...] | list[Failure],
        observations: Mapping[str, ActorObservation] | None = None,
    ) -> FailoverPlan:
        """deal_with_actor_restarting, then failover handling, as the pure policy decides.
        `observations` (this pass's poll) tell which other actors went with a dead one's node."""
        seen = observations or {}
        gone = {name for name, o in seen.items() if _gone(o) or o.unavailable}
        dead_nodes: set[str] = set()
        nodes = {
            self.state.actors[f.actor].node_id or f.node_id
            for f in failures
            if f.kind in DEATH_KINDS and f.actor in self.state.actors
        }
        if nodes - {None}:
            dead_nodes = self.scheduler.dead_nodes([n for n in nodes if n is not None])
        plan = plan_failover(
            self.state, failures, has_extension=self.extension is not None, gone=gone, dead_nodes=dead_nodes
        )
        if plan.ignored and not plan.acts:
            logger.info(
                "job %s: ignored %d report(s) during %s",
                self.state.job,
                len(plan.ignored),
                "a recovery" if self.state.failover else self.state.stage.value,
            )
        with self._lock:
            self.state.node_failures = dict(plan.node_failures) or self.state.node_failures
            for note in plan.notes:
                self.state.record("node_limit", note, at=self.clock())
            self.save()
        if plan.relaunch_nodes and not self._relaunch(plan.relaunch_nodes):
            return plan
        if plan.stop is not None:
            self.finish(EXIT_FAILED, plan.stop)
            return plan
        for recovery in plan.recoveries:
            if self.state.stage is not JobStage.RUNNING:
                break
            self._failover(recovery)
        return plan

    def _relaunch(self, nodes: tuple[str, ...]) -> bool:
        """Tier 4: mark the nodes removed (saved first), then let the Extension replace them."""
        assert self.extension is not None
        with self._lock:
            infos = [
                NodeInfo(node, actors=tuple(n for n, a in self.state.actors.items() if a.node_id == node))
                for node in nodes
            ]
            for node in nodes:
                if node not in self.state.removed_nodes:
                    self.state.removed_nodes.append(node)
            self.state.record(
                "node_relaunch",
                f"relaunching node(s) {', '.join(n[:12] for n in nodes)}",
                tier=Tier.NODE,
                at=self.clock(),
            )
            self.save()
        started = self.clock()
        try:
            replaced = self.extension.relaunch_nodes_impl(infos)
        except Exception as exc:  # ExtensionError, or any bug in the extension: stop safely
            self.finish(
                EXIT_FAILED,
                f"node relaunch of {', '.join(n[:12] for n in nodes)} failed: {type(exc).__name__}: {exc}",
            )
            return False
        with self._lock:
            self.state.node_restart_count += len(nodes)
            for node in nodes:
                self.state.node_failures[node] = 0
            self.state.record(
                "node_relaunched",
                f"{len(nodes)} node(s) replaced by {', '.join(n.node_id[:12] for n in replaced) or 'none'} "
                f"({self.state.node_restart_count}/{self.state.spec.limits.node_max_restart})",
                tier=Tier.NODE,
                duration_s=self.clock() - started,
                at=self.clock(),
            )
            self.save()
        return True

    def _failover(self, recovery: Recovery, escalated: bool = False) -> None:
        """Count, save, act, and clear the in-flight record on every path. A role or SubMaster
        recovery that fails escalates to a job-level restart (`escalated`: the same fault's
        recovery going on, recorded as such, not as another fault); a failed job restart stops
        the job."""
        with self._lock:
            if not recovery.joined:
                self._count(recovery)
            record = FailoverRecord(
                tier=recovery.tier,
                role=recovery.role,
                actors=list(recovery.actors),
                reason=recovery.reason,
                started_at=self.clock(),
                culprit=recovery.culprit,
            )
            self.state.failover = record
            for name in recovery.actors:
                self.state.actors[name].stage = ActorStage.INIT
            self.state.record(
                "failover_escalated"
                if escalated
                else "failover_joined"
                if recovery.joined
                else "failover_started",
                f"{recovery.tier.value} failover of {', '.join(recovery.actors)}: {recovery.reason}",
                role=recovery.role,
                actor=recovery.culprit,
                node_id=recovery.node_id,
                tier=recovery.tier,
                at=record.started_at,
            )
            self.save()
        self.resume_failover()

    def _count(self, recovery: Recovery) -> None:
        state = self.state
        if recovery.tier is Tier.JOB:
            state.job_restart_count += 1
            state.global_restart_count += 1
            for role in state.roles.values():
                role.escalation_count = 0
        elif recovery.tier is Tier.SUB_MASTER and recovery.role is not None:
            state.roles[recovery.role].sub_master_restart_count += 1
        elif recovery.role is not None:
            role = state.roles[recovery.role]
            role.restart_count += 1
            role.escalation_count += 1
            for name in recovery.actors:
                state.actors[name].restart_count += 1

    def resume_failover(self) -> None:
        """Run the saved in-flight recovery to its end (also after a PrimeMaster restart)."""
        record = self.state.failover
        if record is None:
            return
        error: str | None = None
        try:
            if record.tier is Tier.JOB:
                self._restart_job(record)
            elif record.tier is Tier.SUB_MASTER:
                self._restart_sub_master(record)
            else:
                self._restart_role(record)
        except FencedError:
            raise
        except Exception as exc:
            error = f"{type(exc).__name__}: {exc}"
            logger.exception("job %s: %s failover failed", self.state.job, record.tier.value)
        with self._lock:
            self.state.failover = None
            now = self.clock()
            if error is None:
                if self.metrics is not None:
                    self.metrics.failover_done(record.tier.value, now - record.started_at)
                self.state.record(
                    "failover_done",
                    f"{record.tier.value} failover of {', '.join(record.actors)} done in {now - record.started_at:.2f}s",
                    role=record.role,
                    tier=record.tier,
                    duration_s=now - record.started_at,
                    at=now,
                )
            else:
                self.state.record(
                    "failover_failed",
                    f"{record.tier.value} failover failed: {error}",
                    role=record.role,
                    tier=record.tier,
                    at=now,
                )
            self.save()
        if error is None or self.state.stage in (JobStage.STOPPING, JobStage.STOPPED):
            return
        if record.tier is Tier.JOB or self.state.stage is not JobStage.RUNNING:
            self.finish(EXIT_FAILED, f"job-level failover failed: {error}; first failure: {record.reason}")
            return
        first = Failure(record.culprit or record.actors[0], record.role or "", "failover_failed", error)
        recoveries, stop = job_restart(self.state, first, [record.role] if record.role else [])
        if stop is not None:
            self.finish(EXIT_FAILED, stop)
            return
        self._failover(recoveries[0], escalated=True)

    def _restart_role(self, record: FailoverRecord) -> None:
        """Tier 2: through the role's SubMaster when it has one (it calls restart_actors back and
        restarts training), else the PrimeMaster replaces and starts the actors itself."""
        assert record.role is not None
        sub = [n for n, a in self.state.actors.items() if a.role == record.role and a.rank == SUB_MASTER_RANK]
        if sub:
            self.scheduler.call(sub[0], "failover", list(record.actors), record.reason)
        else:
            self._replace(list(record.actors))
            self.scheduler.start(list(record.actors))

    def _restart_sub_master(self, record: FailoverRecord) -> None:
        """Tier 5: SubMasters keep no state: set the role up again and recover it to RUNNING."""
        self._replace(list(record.actors))
        for name in record.actors:
            self.scheduler.call(name, "recover_running")

    def _restart_job(self, record: FailoverRecord) -> None:
        """Tier 3: roll back to INIT, restart every actor, check, and run again."""
        if self.state.stage is JobStage.RUNNING:
            self.transition(JobStage.INIT, f"job-level restart: {record.reason}")
        self._steps.clear()
        self._beats.clear()
        self._replace(list(record.actors))
        self._check([])
        self.transition(JobStage.READY, "every actor restarted and passed its self check")
        self.start()

    def _replace(self, names: list[str]) -> None:
        nodes = self.scheduler.restart(names)
        with self._lock:
            for name, node in nodes.items():
                record = self.state.actors[name]
                record.node_id = node
                record.stage = ActorStage.READY
                record.errors_seen = 0
            self.save()

    def note_inplace_restart(
        self, role: str, message: str, agent: str | None = None, error: str = ""
    ) -> InPlaceDecision:
        """A SubMaster's rank `agent` failed its training process: a fault of its own (tier 1,
        counted here so the count survives the SubMaster), the effect of a peer's fault being
        handled (joined, not counted), or one over the role's limit (the job stops)."""
        peers = [
            n
            for n, a in self.state.actors.items()
            if a.role == role and a.rank != SUB_MASTER_RANK and n != agent
        ]
        dead = [n for n, seen in self.scheduler.poll(peers).items() if _gone(seen)] if peers else []
        with self._lock:
            decision = judge_inplace(self.state, role, agent, message, dead, error)
            record = self.state.actors.get(agent or "")
            node = record.node_id if record is not None else None
            count = self.state.roles[role].inplace_restart_count
            limit = self.state.spec.role(role).max_restart
            if decision.verdict is InPlaceVerdict.RESTART:
                self.state.roles[role].inplace_restart_count = count + 1
                self.state.record(
                    "inplace_restart",
                    f"restart {count + 1}/{limit}: {message}",
                    role=role,
                    actor=agent,
                    node_id=node,
                    tier=Tier.IN_PLACE,
                    at=self.clock(),
                )
            elif decision.verdict is InPlaceVerdict.JOIN:
                self.state.record(
                    "joined_recovery", decision.reason, role=role, actor=agent, node_id=node, at=self.clock()
                )
            else:
                self.state.record(
                    "restart_limit",
                    decision.reason,
                    role=role,
                    actor=agent,
                    tier=Tier.IN_PLACE,
                    at=self.clock(),
                )
            self.save()
        if decision.verdict is InPlaceVerdict.STOP:
            self.request_stop_failed(decision.reason)
        elif dead:
            self.wake()  # the dead peer's failover starts at once
        return decision

    def request_stop_failed(self, reason: str) -> None:
        """Stop the job as failed (a limit reached outside the monitoring thread)."""
        with self._lock:
            if self._failed_request is None:
                self._failed_request = reason
        self._wake.set()

    def finish(self, exit_code: int, reason: str) -> None:
        """Any stage -> STOPPING -> STOPPED: stop and remove every actor and placement group."""
        if self.state.stage in (JobStage.STOPPING, JobStage.STOPPED):
            return
        self.transition(JobStage.STOPPING, reason, exit_code)
        self._finish_stopping()

    def _finish_stopping(self) -> None:
        """Stop, clean up, then STOPPED even if a step failed: a job left in STOPPING would keep
        its driver waiting forever. A failed step is recorded on the timeline."""
        live = [n for n, a in self.state.actors.items() if not a.stage.is_terminal]
        steps: list[tuple[str, Callable[[], None]]] = [
            ("stop", lambda: self.scheduler.stop(live)),
            ("cleanup", self.scheduler.cleanup),
        ]
        for step, call in steps:
            try:
                call()
            except Exception as exc:
                logger.exception("job %s: %s failed", self.state.job, step)
                with self._lock:
                    self.state.record(f"{step}_failed", f"{type(exc).__name__}: {exc}", at=self.clock())
        with self._lock:
            close_actors(self.state)
        self.transition(JobStage.STOPPED)
        self._retain()

    def _retain(self) -> None:
        """A finished job's state may expire (the store's retention); a failure here is harmless."""
        if self.unsaved:
            return
        try:
            if self.store.retain(self.state.job, self.token):
                logger.info("job %s: state kept for the store's retention period", self.state.job)
        except StateStoreError as exc:
            logger.warning("job %s: could not set state retention: %s", self.state.job, exc)
