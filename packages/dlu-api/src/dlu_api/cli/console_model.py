"""What the live console of `dlu run` shows, as plain data: a pure function of the statuses the
client has seen and the time of each (no terminal, no Ray). `console_view` draws it.

The model follows the timeline with a cursor, so it sees every event however many a job makes,
and keeps the failures and recoveries it needs to time each recovery; the rest of the timeline
is counted and its tail kept. Steps per second come from how a role's step moved between the
statuses it was given, on the caller's clock.
"""

from __future__ import annotations

from collections import Counter, deque
from dataclasses import dataclass

from dlu_api.recovery import Recovery, recoveries
from dlu_api.status import ActorStatus, EventCursor, JobEvent, JobStatus, RoleStatus
from dlu_api.vocabulary import FAILURE_EVENTS, RECOVERED_EVENTS, RECOVERY_EVENTS, RECOVERY_OPENERS

SUB_MASTER_RANK = -1
"""The rank a role's SubMaster has in a status (dlu_prime.master.state.SUB_MASTER_RANK)."""

KEPT_KINDS = FAILURE_EVENTS | RECOVERY_EVENTS | RECOVERY_OPENERS | RECOVERED_EVENTS
"""Events the model keeps whole: what the incidents and the root cause are read from."""

MAX_KEPT = 2000
"""At most this many kept events (the oldest go first; the first failure is kept apart)."""

RATE_WINDOW_S = 10.0
"""Steps per second are measured over about this long."""


@dataclass(frozen=True)
class RoleRow:
    """One role of the job, as a line of the roles table."""

    name: str
    kind: str
    size: int
    states: tuple[tuple[str, int], ...]
    """How many of its workers (ranks) are in each stage, by stage name; no SubMaster."""
    sub_master: str | None
    """The stage of its SubMaster, None without one (or once its workers have all finished)."""
    step: int | None
    """Its furthest rank's step: the final one once the role finished."""
    steps_per_s: float | None
    metric: float | None
    """The last metric its lowest-ranked reporting worker sent (`heartbeat(step, metric)`)."""
    restarts: int
    inplace_restarts: int
    resizes: int


@dataclass(frozen=True)
class Incident:
    """One failure, and its recovery once there is one."""

    time: float
    where: str
    kind: str
    message: str
    recovered_by: str | None
    tier: str | None
    duration_s: float | None


@dataclass(frozen=True)
class ConsoleState:
    job: str
    stage: str
    exit_code: int | None
    reason: str
    elapsed_s: float | None
    """Since the first event the console saw."""
    roles: tuple[RoleRow, ...]
    restarts: tuple[tuple[str, int], ...]
    """Restarts by failover tier, the tiers with none left out."""
    incidents: tuple[Incident, ...]
    """The latest failures, oldest first, each with its recovery and how long it took."""
    incident_count: int
    first_failure: JobEvent | None
    """The job's first failure: the root cause, whatever happened after."""
    event_count: int
    recent: tuple[JobEvent, ...]
    stalled: str | None = None
    """The PrimeMaster's "stalled" notice while it holds (what waits on what), else None."""

    @property
    def finished(self) -> bool:
        return self.stage in ("STOPPED", "LOST")


def restarts_by_tier(status: JobStatus) -> tuple[tuple[str, int], ...]:
    tiers = (
        ("in place", sum(r.inplace_restart_count for r in status.roles)),
        ("role", sum(r.restart_count for r in status.roles)),
        ("SubMaster", sum(r.sub_master_restart_count for r in status.roles)),
        ("global", status.global_restart_count),
        ("job", status.job_restart_count),
        ("node", status.node_restart_count),
        ("master", status.master_restart_count),
    )
    return tuple((tier, n) for tier, n in tiers if n)


def workers_of(role: RoleStatus) -> list[ActorStatus]:
    return [a for a in role.actors if a.rank != SUB_MASTER_RANK]


def sub_master_stage(role: RoleStatus, workers: list[ActorStatus]) -> str | None:
    """A SubMaster lives until the job ends; once its workers finished it drives nothing, and
    is not shown (never as RUNNING beside a finished role)."""
    found = next((a for a in role.actors if a.rank == SUB_MASTER_RANK), None)
    if found is None or (workers and all(a.stage == "FINISH" for a in workers)):
        return None
    return found.stage


def _metric(workers: list[ActorStatus]) -> float | None:
    return next((a.metric for a in sorted(workers, key=lambda a: a.rank) if a.metric is not None), None)


class StepRate:
    """Steps per second of one role over the last `RATE_WINDOW_S`, from (time, step) samples."""

    def __init__(self) -> None:
        self._samples: deque[tuple[float, int]] = deque()

    def add(self, now: float, step: int | None) -> float | None:
        if step is None:
            self._samples.clear()
            return None
        if self._samples and step < self._samples[-1][1]:
            self._samples.clear()  # it went back (resumed from a checkpoint): measure afresh
        if not self._samples or self._samples[-1] != (now, step):
            self._samples.append((now, step))
        while len(self._samples) > 2 and now - self._samples[1][0] >= RATE_WINDOW_S:
            self._samples.popleft()
        (t0, s0), (t1, s1) = self._samples[0], self._samples[-1]
        return (s1 - s0) / (t1 - t0) if t1 > t0 else None


class ConsoleModel:
    """Feed it each status as it comes (`update`); it returns what the console shows."""

    def __init__(self, recent: int = 4, incidents: int = 6) -> None:
        self._cursor = EventCursor()
        self._kept: deque[JobEvent] = deque(maxlen=MAX_KEPT)
        self._recent: deque[JobEvent] = deque(maxlen=recent)
        self._incidents = incidents
        self._first_failure: JobEvent | None = None
        self._count = 0
        self._started: float | None = None  # when it first saw the job, on the caller's clock
        self._rates: dict[str, StepRate] = {}
        self._stalled: str | None = None

    def update(self, status: JobStatus, now: float) -> ConsoleState:
        """`now` is the caller's clock (monotonic seconds), used for steps per second and the
        elapsed time; event times are only compared with each other."""
        fresh = self._cursor.take(status.events)
        for event in fresh:
            self._count += 1
            self._recent.append(event)
            if event.kind in KEPT_KINDS:
                self._kept.append(event)
            if self._first_failure is None and event.kind in FAILURE_EVENTS:
                self._first_failure = event
            if event.kind == "stalled":
                self._stalled = event.message
            elif event.kind == "progress_resumed":
                self._stalled = None
        if self._started is None and (fresh or status.roles):
            self._started = now
        if status.first_failure is not None:
            self._first_failure = status.first_failure  # the PrimeMaster's, kept for the whole job
        found = recoveries(self._kept)
        roles = tuple(self._role_row(role, now) for role in status.roles)
        return ConsoleState(
            job=status.name,
            stage=status.stage.value,
            exit_code=status.exit_code,
            reason=status.reason,
            elapsed_s=None if self._started is None else now - self._started,
            roles=roles,
            restarts=restarts_by_tier(status),
            incidents=tuple(_incident(r) for r in found[-self._incidents :]),
            incident_count=len(found),
            first_failure=self._first_failure,
            event_count=self._count,
            recent=tuple(self._recent),
            stalled=self._stalled if status.stage.value == "RUNNING" else None,
        )

    def _role_row(self, role: RoleStatus, now: float) -> RoleRow:
        workers = workers_of(role)
        steps = [a.step for a in workers if a.step is not None]
        step = max(steps) if steps else None
        finished = bool(workers) and all(a.stage == "FINISH" for a in workers)
        rate = self._rates.setdefault(role.name, StepRate()).add(now, step)
        return RoleRow(
            name=role.name,
            kind=role.kind,
            size=role.size or len(workers),
            states=tuple(sorted(Counter(a.stage for a in workers).items())),
            sub_master=sub_master_stage(role, workers),
            step=step,
            steps_per_s=None if finished else rate,
            metric=_metric(workers),
            restarts=role.restart_count,
            inplace_restarts=role.inplace_restart_count,
            resizes=role.resize_count,
        )


def _incident(found: Recovery) -> Incident:
    failure = found.failure
    return Incident(
        time=failure.time,
        where="/".join(p for p in (failure.role, failure.actor) if p),
        kind=failure.kind,
        message=failure.message,
        recovered_by=found.done.kind if found.done is not None else None,
        tier=found.tier,
        duration_s=found.duration_s,
    )
