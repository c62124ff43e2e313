"""The Brain: administrators per running job, the optimize processor and executor, over the
database. Thread-safe (one lock); every call reads or writes the database, and raises
`DatabaseUnavailableError` while it is down (the HTTP layer answers 503, the jobs buffer)."""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field, replace
from typing import Any

from dlu_brain.administrator import AdminSettings, JobAdministrator, Trigger, size_now
from dlu_brain.db import AppliedSize, BrainDatabase, DatabaseUnavailableError, JobRow
from dlu_brain.optimizer import JobFacts, OptimizerSettings, merge_history, placement_problem, plan_for
from dlu_prime.brain_port import JobPlan, JobRegistration, PlanOutcome, RolePlan, RoleShape, StatSample

logger = logging.getLogger(__name__)


@dataclass
class _Job:
    row: JobRow
    admin: JobAdministrator
    sizes: dict[str, int]
    unplaceable: set[tuple[str, int]] = field(default_factory=set[tuple[str, int]])
    applied: dict[str, AppliedSize] = field(default_factory=dict[str, AppliedSize])


class Brain:
    def __init__(
        self,
        db: BrainDatabase,
        admin_settings: AdminSettings | None = None,
        optimizer_settings: OptimizerSettings | None = None,
    ) -> None:
        self.db = db
        self.admin_settings = admin_settings or AdminSettings()
        self.settings = optimizer_settings or OptimizerSettings()
        self._lock = threading.RLock()
        self._jobs: dict[int, _Job] = {}
        self._resumed = False
        self.available: dict[str, float] | None = None  # the Cluster Monitor's latest free resources
        self.started_at = time.time()

    # -- lifecycle --------------------------------------------------------------------------
    def resume(self) -> int:
        """Migrate the database and take every running job back (its samples, its events); the
        number of administrators resumed."""
        with self._lock:
            self.db.migrate()
            self._jobs.clear()
            for row in self.db.running_jobs():
                self._take(row, resumed=True)
            self._resumed = True
            logger.info("Brain resumed %d administrators from %s", len(self._jobs), self.db.where)
            return len(self._jobs)

    def _ready(self) -> None:
        if not self._resumed:
            self.resume()

    def _take(self, row: JobRow, resumed: bool) -> _Job:
        roles = {k: RoleShape.model_validate(v) for k, v in row.roles.items()}
        job = _Job(
            row,
            JobAdministrator(row.id, row.name, roles, self.admin_settings),
            {k: r.size for k, r in roles.items()},
        )
        if resumed:
            events = self.db.events(row.id)
            job.admin.resume(
                self.db.samples(row.id),
                [Trigger(e.kind, e.role, e.detail).key for e in events],
            )
            for plan in self.db.plans(row.id):
                if plan.state == "unplaceable" and plan.size is not None:
                    job.unplaceable.add((plan.role, plan.size))
            job.applied = self.db.applied_sizes(row.id)
            self._update_sizes(job)
            logger.info("job %s run %s resumed at sizes %s", row.name, row.run_id, job.sizes)
        self._jobs[row.id] = job
        return job

    # -- the job's calls --------------------------------------------------------------------
    def start_job(self, registration: JobRegistration) -> JobPlan:
        with self._lock:
            self._ready()
            job_id = self.db.register_job(registration)
            job = self._jobs.get(job_id)
            if job is None:
                row = self.db.job(job_id) or _missing(registration.name)
                seen = bool(self.db.events(job_id))  # a restarted master registering again
                job = self._take(row, resumed=seen)
                if not seen:
                    self._handle(job, job.admin.start())
            return self._plan(job)

    def add_samples(self, name: str, run_id: str, samples: list[StatSample]) -> int:
        with self._lock:
            job = self._job(name, run_id)
            fresh = self.db.add_samples(job.row.id, samples)
            if fresh:  # a batch sent again is seen by the administrator once
                triggers = job.admin.observe(fresh)
                self._update_sizes(job)
                self._handle(job, triggers)
            return len(fresh)

    def plan(self, name: str, run_id: str | None = None) -> JobPlan:
        with self._lock:
            self._ready()
            if run_id is None:
                row = self.db.find_job(name)
                if row is None:
                    raise KeyError(f"the Brain knows no job {name!r}")
                job = self._jobs.get(row.id) or _Job(row, JobAdministrator(row.id, row.name, {}), {})
                return self._plan(job)
            return self._plan(self._job(name, run_id))

    def plan_outcome(self, name: str, outcome: PlanOutcome) -> None:
        with self._lock:
            job = self._job(name, outcome.run_id)
            plans = {p.id: p for p in self.db.plans(job.row.id)}
            plan = plans.get(outcome.plan_id)
            if plan is None:
                raise KeyError(f"job {name!r} has no plan {outcome.plan_id}")
            self.db.acknowledge_plan(job.row.id, outcome.plan_id, outcome.state, outcome.reason)
            if plan.size is not None:
                if outcome.state == "applied":
                    job.applied = self.db.applied_sizes(job.row.id)
                    self._update_sizes(job)
                else:
                    job.unplaceable.add((plan.role, plan.size))
                    logger.warning("job %s: plan %d (%s -> %s) cannot be placed: %s; not proposed again",
                                   name, plan.id, plan.role, plan.size, outcome.reason)  # fmt: skip

    def end_job(self, name: str, run_id: str, outcome: str) -> None:
        with self._lock:
            job = self._job(name, run_id)
            self.db.end_job(job.row.id, outcome)
            self._jobs.pop(job.row.id, None)

    # -- the Cluster Monitor's calls --------------------------------------------------------
    def cluster_sample(
        self,
        alive: int,
        dead: int,
        total: dict[str, float],
        available: dict[str, float],
        pending: list[dict[str, float]],
    ) -> None:
        with self._lock:
            self._ready()
            self.db.add_cluster_sample(alive, dead, total, available, pending)
            grew = self.available is None or any(available.get(k, 0) > v for k, v in self.available.items())
            self.available = available
            for job in list(self._jobs.values()):
                if grew:
                    job.unplaceable.clear()  # more room: sizes that did not fit may fit now
                self._handle(job, job.admin.idle(available, job.sizes))

    # -- reads ------------------------------------------------------------------------------
    def status(self) -> dict[str, Any]:
        with self._lock:
            self._ready()
            return {
                "database": self.db.where,
                "started_at": self.started_at,
                "jobs": [
                    {
                        "name": j.row.name,
                        "run_id": j.row.run_id,
                        "sizes": j.sizes,
                        "signature": j.row.signature,
                        "marginal_threshold": self._settings_for(j).linear_threshold,
                        "backlog_target_s": self._settings_for(j).backlog_target_s,
                    }
                    for j in self._jobs.values()
                ],
                "cluster": self.db.latest_cluster_sample(),
            }

    # -- inside -----------------------------------------------------------------------------
    def _job(self, name: str, run_id: str) -> _Job:
        self._ready()
        for job in self._jobs.values():
            if job.row.name == name and job.row.run_id == run_id:
                return job
        row = self.db.find_job(name, run_id)
        if row is None or row.ended_at is not None:
            raise KeyError(f"the Brain has no running job {name!r} run {run_id!r}; register it first")
        return self._take(row, resumed=True)

    def _plan(self, job: _Job) -> JobPlan:
        return JobPlan(job=job.row.name, run_id=job.row.run_id, roles=self.db.current_plans(job.row.id))

    def _handle(self, job: _Job, triggers: list[Trigger]) -> None:
        for trigger in triggers:
            event_id = self.db.add_event(job.row.id, trigger.kind, trigger.role, _jsonable(trigger.detail))
            plans = plan_for(trigger, self._facts(job, trigger), self._settings_for(job))
            for plan in plans:
                self._execute(job, plan, event_id)
            self.db.set_event_state(event_id, "planned" if plans else "no_change")

    def _settings_for(self, job: _Job) -> OptimizerSettings:
        """The job's own threshold and backlog target where it sent them; the Brain's settings
        for what it did not send."""
        settings = self.settings
        if job.row.marginal_threshold is not None:
            settings = replace(settings, linear_threshold=job.row.marginal_threshold)
        if job.row.backlog_target_s is not None:
            settings = replace(settings, backlog_target_s=job.row.backlog_target_s)
        return settings

    def _update_sizes(self, job: _Job) -> None:
        """Each role's size now: the later of its last sample and its last applied plan (after a
        restart too, where the last sample may be from before a plan the job applied since)."""
        for role, shape in job.admin.roles.items():
            applied = job.applied.get(role)
            job.sizes[role] = size_now(
                shape.size,
                job.admin.last_sample.get(role),
                None if applied is None else (applied.after_seq, applied.size),
            )

    def _execute(self, job: _Job, plan: RolePlan, event_id: int) -> None:
        shape = job.admin.roles[plan.role]
        current = job.sizes.get(plan.role, shape.size)
        problem = placement_problem(plan, shape, current, self.available)
        if problem:
            plan = plan.model_copy(
                update={"state": "unplaceable", "reason": f"{plan.reason} [unplaceable: {problem}]"}
            )
            if plan.size is not None:
                job.unplaceable.add((plan.role, plan.size))
            logger.warning("job %s: %s", job.row.name, plan.reason)
        plan_id = self.db.add_plan(job.row.id, plan, event_id)
        logger.info("job %s: plan %d %s (%s)", job.row.name, plan_id, plan.reason, plan.algorithm)

    def _facts(self, job: _Job, trigger: Trigger) -> JobFacts:
        roles = job.admin.roles
        by_size = (
            {r: self.db.throughput_by_size(job.row.id, r) for r in roles}
            if trigger.kind != "job_start"
            else {}
        )
        history: dict[str, dict[int, float]] = {}
        if trigger.kind == "job_start":
            finished = self.db.finished_jobs(signature=job.row.signature, limit=20)
            for role in roles:
                history[role] = merge_history([self.db.throughput_by_size(f.id, role) for f in finished])
        return JobFacts(
            roles=roles,
            sizes=dict(job.sizes),
            by_size=by_size,
            history=history,
            backlog=self._backlog(job) if trigger.kind not in ("job_start", "memory_pressure") else {},
            unplaceable=set(job.unplaceable),
        )

    def _backlog(self, job: _Job) -> dict[str, tuple[int, float]]:
        """Per role draining a channel: the newest backlog and what one actor drains per second:
        the job's own measure where the sample carries it (items while the queue had work), else
        (from an older job) the role's measured speed per actor."""
        out: dict[str, tuple[int, float]] = {}
        newest: dict[str, StatSample] = {}
        for sample in self.db.samples(job.row.id, kind="backlog", limit=200):
            if sample.role:
                newest[sample.role] = sample
        for role, sample in newest.items():
            if sample.samples_per_s:
                out[role] = (sample.backlog or 0, sample.samples_per_s)
                continue
            rates = self.db.throughput_by_size(job.row.id, role)
            per_actor = [v / n for n, v in rates.items() if n > 0]
            out[role] = (sample.backlog or 0, sum(per_actor) / len(per_actor) if per_actor else 0.0)
        return out


def _missing(name: str) -> JobRow:
    raise DatabaseUnavailableError(f"job {name!r} vanished from the database right after it was registered")


def _jsonable(detail: dict[str, Any]) -> dict[str, Any]:
    return {
        k: (v if isinstance(v, str | int | float | bool | list | dict) or v is None else str(v))
        for k, v in detail.items()
    }
