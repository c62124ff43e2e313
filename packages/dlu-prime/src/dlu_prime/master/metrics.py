"""A job's metrics (`SERIES`: stage, restarts per failover tier, heartbeat age per role,
failover durations, node check scores). On a cluster they go through Ray's metrics API
(`ray.util.metrics`), which Ray exports to Prometheus from every node; under a local `dlu run`
(whose embedded Ray has no metrics agent) through dlu_prime.local_metrics to the endpoint the
driver serves.

The PrimeManager calls `JobMetrics` from its loop; none of it may ever break a job. When the
metrics cannot be created (no Ray, a unit test, an old Ray) or a recording fails, `JobMetrics`
logs once and carries on as a no-op. The backend is injectable so tests can see the values.

Ray's agent exports a gauge only while it is being set: one set once (a node check's scores)
vanished from the endpoint. Gauges are therefore set again on every look (`observe_state`) or,
where nothing looks regularly, by `refresh` (the ElasticMaster calls it as its ranks beat).

Every metric carries the `dlu_job` tag (not `job`: Prometheus sets that one to its scrape job
and would rename ours `exported_job`). Names follow Prometheus conventions (`_seconds`, `_total`);
Ray may prefix them (`ray_`) on export.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from dlu_api.spec.models import RoleKind
from dlu_api.status import JobStage
from dlu_prime.brain_port.models import StatSample
from dlu_prime.master.state import SUB_MASTER_RANK, JobState, role_size
from dlu_prime.master.tiers import CHARGED, totals
from dlu_prime.stats.throughput import Throughput

logger = logging.getLogger(__name__)

STAGE_CODES: dict[JobStage, int] = {
    JobStage.PENDING: 0,
    JobStage.INIT: 1,
    JobStage.READY: 2,
    JobStage.RUNNING: 3,
    JobStage.STOPPING: 4,
    JobStage.STOPPED: 5,
    JobStage.LOST: 6,  # never a PrimeMaster's own stage; listed so every stage has a code
}

FAILOVER_BOUNDARIES_S: tuple[float, ...] = (
    0.25,
    0.5,
    1.0,
    1.5,
    2.0,
    3.0,
    4.0,
    6.0,
    10.0,
    20.0,
    30.0,
    60.0,
    120.0,
)
"""Histogram buckets around DESIGN section 9's recovery budgets (1.5 s in place, 4 s role)."""

TIER_COUNTS: dict[str, Callable[[JobState], int]] = {
    budget.value: lambda s, b=budget.value: totals(s)[b] for budget in CHARGED.values()
}
"""Restarts per failover tier, read from the counters the tiers charge (`tiers.CHARGED`): one
restart is one increment of one series. The global budget is spent by every job-level restart
(already `job`), so it is no tier of its own here (`dlu status` shows it)."""


@dataclass(frozen=True)
class Series:
    """One exported series; docs/metrics.md lists each (a test holds the two equal)."""

    name: str
    kind: Literal["gauge", "counter", "histogram"]
    labels: tuple[str, ...]
    help: str
    boundaries: tuple[float, ...] = ()


SERIES: tuple[Series, ...] = (
    Series("dlu_job_stage", "gauge", ("dlu_job", "stage"), "1 for the job's current stage, else 0"),
    Series(
        "dlu_job_stage_code",
        "gauge",
        ("dlu_job",),
        "the job's stage as a number: " + ", ".join(f"{s.value}={c}" for s, c in STAGE_CODES.items()),
    ),
    Series(
        "dlu_restarts_total",
        "counter",
        ("dlu_job", "tier"),
        "restarts by failover tier (role, job, node, master, ...)",
    ),
    Series("dlu_role_restarts_total", "counter", ("dlu_job", "role"), "restarts of each role's actors"),
    Series(
        "dlu_heartbeat_age_seconds",
        "gauge",
        ("dlu_job", "role"),
        "age of the oldest heartbeat among a role's workers (ranks; never its SubMaster)",
    ),
    Series(
        "dlu_failover_duration_seconds",
        "histogram",
        ("dlu_job", "tier"),
        "failure detected -> training again, per failover tier",
        FAILOVER_BOUNDARIES_S,
    ),
    Series(
        "dlu_failover_seconds_total",
        "counter",
        ("dlu_job", "tier"),
        "the failover durations summed, exactly (Ray's exporter writes a histogram's sum from "
        "bucket midpoints); divide by dlu_failover_duration_seconds_count for the mean",
    ),
    Series(
        "dlu_world_size",
        "gauge",
        ("dlu_job", "role"),
        "an elastic role's training world size now (its ranks; follows every resize)",
    ),
    Series(
        "dlu_node_check_score_seconds",
        "gauge",
        ("dlu_job", "node"),
        "a node's node-check time (its best round)",
    ),
    Series(
        "dlu_role_steps_per_second",
        "gauge",
        ("dlu_job", "role", "world_size"),
        "a role's measured training speed at each world size it ran at (nodes of an elastic role)",
    ),
    Series(
        "dlu_actor_cpu_percent",
        "gauge",
        ("dlu_job", "role", "actor"),
        "CPU use of an actor's processes (100 = one core), as the actor measured it",
    ),
    Series(
        "dlu_actor_memory_bytes",
        "gauge",
        ("dlu_job", "role", "actor"),
        "resident memory of an actor's processes",
    ),
    Series(
        "dlu_queue_backlog",
        "gauge",
        ("dlu_job", "queue"),
        "items waiting in a data channel, or shards to do in a shard queue",
    ),
    Series(
        "dlu_checkpoint_lost_steps_total",
        "counter",
        ("dlu_job", "role"),
        "training steps redone after recoveries (reached minus the checkpoint step resumed)",
    ),
)
"""Every series DLU exports, in one place: Ray's exporter on a cluster and the local endpoint
of `dlu run` (dlu_prime.local_metrics) serve the same ones."""


class Recorder(Protocol):
    """What a created metric offers: Ray's Gauge.set, Counter.inc and Histogram.observe all
    take `(value, tags)`, so one method covers the three."""

    def record(self, value: float, tags: dict[str, str]) -> None: ...


class MetricsBackend(Protocol):
    def gauge(self, name: str, description: str, tag_keys: Sequence[str]) -> Recorder: ...

    def counter(self, name: str, description: str, tag_keys: Sequence[str]) -> Recorder: ...

    def histogram(
        self, name: str, description: str, boundaries: Sequence[float], tag_keys: Sequence[str]
    ) -> Recorder: ...


class _RayRecorder:
    def __init__(self, record: Callable[..., Any]) -> None:
        self._record = record

    def record(self, value: float, tags: dict[str, str]) -> None:
        self._record(value, tags=tags)


class RayMetricsBackend:
    """`ray.util.metrics`, imported on first use (dlu-prime's unit tests never import Ray)."""

    def gauge(self, name: str, description: str, tag_keys: Sequence[str]) -> Recorder:
        from ray.util.metrics import Gauge

        return _RayRecorder(Gauge(name, description, tag_keys=tuple(tag_keys)).set)

    def counter(self, name: str, description: str, tag_keys: Sequence[str]) -> Recorder:
        from ray.util.metrics import Counter

        return _RayRecorder(Counter(name, description, tag_keys=tuple(tag_keys)).inc)

    def histogram(
        self, name: str, description: str, boundaries: Sequence[float], tag_keys: Sequence[str]
    ) -> Recorder:
        from ray.util.metrics import Histogram

        metric = Histogram(name, description, boundaries=list(boundaries), tag_keys=tuple(tag_keys))
        return _RayRecorder(metric.observe)


def default_backend() -> MetricsBackend:
    """The local endpoint's files when this process runs under `dlu run`'s embedded Ray (its
    driver sets the directory before Ray starts), else Ray's metrics."""
    from dlu_prime import local_metrics

    local = local_metrics.backend_from_env()
    return local if local is not None else RayMetricsBackend()


def create_series(backend: MetricsBackend) -> dict[str, Recorder]:
    """Each of `SERIES` created on `backend`, by name."""
    made: dict[str, Recorder] = {}
    for series in SERIES:
        if series.kind == "gauge":
            made[series.name] = backend.gauge(series.name, series.help, series.labels)
        elif series.kind == "counter":
            made[series.name] = backend.counter(series.name, series.help, series.labels)
        else:
            made[series.name] = backend.histogram(series.name, series.help, series.boundaries, series.labels)
    return made


_warned = False
_warned_lock = threading.Lock()


def _warn_once(message: str, exc: BaseException) -> None:
    global _warned
    with _warned_lock:
        if _warned:
            return
        _warned = True
    logger.warning("%s; job metrics are off from now on (%s: %s)", message, type(exc).__name__, exc)


class JobMetrics:
    """The metrics of one job. Safe to call from any thread; never raises."""

    def __init__(self, job: str, backend: MetricsBackend | None = None) -> None:
        self.job = job
        self.enabled = True
        self._lock = threading.Lock()
        self._restarts_seen: dict[str, int] = {}
        self._role_restarts_seen: dict[str, int] = {}
        self._scores: dict[str, float] = {}
        try:
            made = create_series(backend if backend is not None else default_backend())
            self._stage = made["dlu_job_stage"]
            self._stage_code = made["dlu_job_stage_code"]
            self._restarts = made["dlu_restarts_total"]
            self._role_restarts = made["dlu_role_restarts_total"]
            self._heartbeat_age = made["dlu_heartbeat_age_seconds"]
            self._failover = made["dlu_failover_duration_seconds"]
            self._failover_seconds = made["dlu_failover_seconds_total"]
            self._world_size = made["dlu_world_size"]
            self._node_score = made["dlu_node_check_score_seconds"]
            self._lost_steps = made["dlu_checkpoint_lost_steps_total"]
            self._speed = made["dlu_role_steps_per_second"]
            self._cpu = made["dlu_actor_cpu_percent"]
            self._memory = made["dlu_actor_memory_bytes"]
            self._backlog = made["dlu_queue_backlog"]
        except Exception as exc:
            self.enabled = False
            _warn_once(f"job {job}: cannot create the metrics", exc)

    def _safely(self, what: str, record: Callable[[], None]) -> None:
        if not self.enabled:
            return
        try:
            with self._lock:
                record()
        except Exception as exc:
            self.enabled = False
            _warn_once(f"job {self.job}: recording {what} failed", exc)

    def observe_state(self, state: JobState, heartbeat_ages: Mapping[str, float]) -> None:
        """Stage, restart counters and heartbeat age per role (the max over the role's workers;
        a SubMaster's own age says nothing of its ranks); `heartbeat_ages` maps actor name ->
        seconds since its last heartbeat."""

        def record() -> None:
            job = {"dlu_job": self.job}
            for stage in STAGE_CODES:
                self._stage.record(1.0 if stage is state.stage else 0.0, {**job, "stage": stage.value})
            self._stage_code.record(float(STAGE_CODES[state.stage]), job)
            for tier, count in TIER_COUNTS.items():
                self._increase(self._restarts, self._restarts_seen, tier, count(state), {**job, "tier": tier})
            for role, record_ in state.roles.items():
                self._increase(
                    self._role_restarts,
                    self._role_restarts_seen,
                    role,
                    record_.restart_count,
                    {**job, "role": role},
                )
            oldest: dict[str, float] = {}
            for actor, age in heartbeat_ages.items():
                found = state.actors.get(actor)
                if found is not None and found.rank != SUB_MASTER_RANK:
                    oldest[found.role] = max(age, oldest.get(found.role, 0.0))
            for role, age in oldest.items():
                self._heartbeat_age.record(age, {**job, "role": role})
            for spec in state.spec.roles:
                if spec.kind is RoleKind.ELASTIC:
                    self._world_size.record(float(role_size(state, spec.name)), {**job, "role": spec.name})

        self._safely("the job state", record)

    @staticmethod
    def _increase(
        counter: Recorder, seen: dict[str, int], key: str, total: int, tags: dict[str, str]
    ) -> None:
        """Counters only go up: add what the state's total gained since the last look. A
        PrimeMaster that resumes a stored job starts its (new) series at the stored total."""
        gained = total - seen.get(key, 0)
        if gained > 0:
            counter.record(float(gained), tags)
        seen[key] = max(total, seen.get(key, 0))

    def observe_statistics(
        self, speeds: Sequence[Throughput], usage: Mapping[str, StatSample], backlogs: Mapping[str, int]
    ) -> None:
        """The runtime statistics (`dlu_prime.autoscale.feed`): speed per role and world size,
        each actor's CPU and memory, each queue's backlog."""

        def record() -> None:
            job = {"dlu_job": self.job}
            for t in speeds:
                if t.steps_per_s is not None:
                    self._speed.record(
                        t.steps_per_s, {**job, "role": t.role, "world_size": str(t.world_size)}
                    )
            for actor, sample in usage.items():
                tags = {**job, "role": sample.role or "", "actor": actor}
                if sample.cpu_percent is not None:
                    self._cpu.record(sample.cpu_percent, tags)
                if sample.memory_bytes is not None:
                    self._memory.record(float(sample.memory_bytes), tags)
            for queue, count in backlogs.items():
                self._backlog.record(float(count), {**job, "queue": queue})

        self._safely("the runtime statistics", record)

    def failover_done(self, tier: str, duration_s: float) -> None:
        """One recovery of `tier` took `duration_s` (failure detected -> training again)."""
        tags = {"dlu_job": self.job, "tier": tier}

        def record() -> None:
            self._failover.record(duration_s, tags)
            self._failover_seconds.record(duration_s, tags)

        self._safely("a failover", record)

    def lost_steps(self, role: str, steps: int) -> None:
        """A recovery resumed `steps` steps behind the step the role had reached."""
        self._safely(
            "lost steps", lambda: self._lost_steps.record(float(steps), {"dlu_job": self.job, "role": role})
        )

    def node_check_scores(self, scores: Mapping[str, float]) -> None:
        """Each node's node-check score (seconds, lower is better), kept for `refresh`; a new
        check replaces the last one's scores."""
        with self._lock:
            self._scores = dict(scores)
        self.refresh()

    def refresh(self) -> None:
        """Set the kept gauges again so that Ray keeps exporting them."""

        def record() -> None:
            for node, score in self._scores.items():
                self._node_score.record(score, {"dlu_job": self.job, "node": node})

        self._safely("node check scores", record)
