"""The Brain's database: one class over SQLAlchemy Core, the same on SQLite and PostgreSQL.

Every method is one short transaction. A database that cannot be reached raises
`DatabaseUnavailableError` (the service answers 503 and the jobs keep their statistics);
anything else wrong is a bug and raises as it is.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlalchemy import event as sa_event
from sqlalchemy import exc as sa_exc

from dlu_brain.db import schema as t
from dlu_brain.db.migrations import migrate
from dlu_prime.brain_port import JobRegistration, RolePlan, StatSample

logger = logging.getLogger(__name__)

SAMPLE_FIELDS = tuple(f for f in StatSample.model_fields if f != "seq")


class DatabaseUnavailableError(RuntimeError):
    """The database did not answer (its server is down, or the file cannot be opened)."""


@dataclass(frozen=True)
class JobRow:
    id: int
    name: str
    run_id: str
    signature: str
    roles: dict[str, Any]
    entrypoint: str
    config_hash: str
    started_at: float
    ended_at: float | None
    outcome: str | None
    marginal_threshold: float | None = None  # None: registered without one (the Brain's own)
    backlog_target_s: float | None = None  # None: registered without one (the Brain's own)


@dataclass(frozen=True)
class AppliedSize:
    """The size of a role's newest plan the job answered as applied, and the newest sample `seq`
    the Brain held for the job when that answer came (-1: none; None: answered before schema
    version 3 recorded it, so its order against the samples is unknown)."""

    role: str
    size: int
    plan_id: int
    after_seq: int | None


@dataclass(frozen=True)
class EventRow:
    id: int
    job_id: int
    time: float
    kind: str
    role: str | None
    detail: dict[str, Any]
    state: str


def default_sqlite_url(home: Path) -> str:
    return f"sqlite:///{home / 'brain.sqlite'}"


def check_url(url: str) -> str:
    """Refuse a URL the Brain cannot use, naming the fix (before anything starts)."""
    try:
        parsed = sa.make_url(url)
    except sa_exc.ArgumentError:
        raise ValueError(
            f"--db {url!r} is not a database URL: give sqlite:///PATH or postgresql+psycopg://USER@HOST:PORT/DB"
        ) from None
    if parsed.get_backend_name() not in ("sqlite", "postgresql"):
        raise ValueError(f"--db {url!r}: the Brain stores in SQLite or PostgreSQL only")
    if parsed.get_backend_name() == "postgresql" and parsed.get_driver_name() in ("psycopg2", "pg8000"):
        raise ValueError(f"--db {url!r}: use the psycopg (3) driver: postgresql+psycopg://...")
    if parsed.get_backend_name() == "postgresql" and parsed.drivername == "postgresql":
        return str(parsed.set(drivername="postgresql+psycopg").render_as_string(hide_password=False))
    return url


class BrainDatabase:
    def __init__(self, url: str, *, connect_timeout_s: float = 3.0) -> None:
        self.url = check_url(url)
        parsed = sa.make_url(self.url)
        self.backend = parsed.get_backend_name()
        if self.backend == "sqlite":
            if parsed.database and parsed.database != ":memory:":
                Path(parsed.database).parent.mkdir(parents=True, exist_ok=True)
            self.engine = sa.create_engine(
                self.url, connect_args={"timeout": 30, "check_same_thread": False}, pool_pre_ping=True
            )
            sa_event.listen(self.engine, "connect", _sqlite_pragmas)
        else:
            self.engine = sa.create_engine(
                self.url, connect_args={"connect_timeout": max(1, int(connect_timeout_s))}, pool_pre_ping=True
            )

    @property
    def where(self) -> str:
        return sa.make_url(self.url).render_as_string(hide_password=True)

    def close(self) -> None:
        self.engine.dispose()

    @contextmanager
    def _tx(self) -> Iterator[sa.Connection]:
        try:
            with self.engine.begin() as conn:
                yield conn
        except (sa_exc.OperationalError, sa_exc.InterfaceError) as exc:
            if isinstance(exc, sa_exc.DBAPIError) and exc.connection_invalidated:
                self.engine.dispose()
            raise DatabaseUnavailableError(f"database {self.where} unavailable: {exc.orig or exc}") from exc

    def migrate(self) -> int:
        try:
            return migrate(self.engine)
        except (sa_exc.OperationalError, sa_exc.InterfaceError) as exc:
            raise DatabaseUnavailableError(f"database {self.where} unavailable: {exc.orig or exc}") from exc

    # -- jobs -------------------------------------------------------------------------------
    def register_job(self, job: JobRegistration, now: float | None = None) -> int:
        """The job's row id; the same id again for a run already registered (a restarted master)."""
        with self._tx() as conn:
            found = conn.execute(
                sa.select(t.jobs.c.id).where(t.jobs.c.name == job.name, t.jobs.c.run_id == job.run_id)
            ).scalar()
            if found is not None:
                return int(found)
            return _new_id(
                conn.execute(
                    t.jobs.insert().values(
                        name=job.name,
                        run_id=job.run_id,
                        signature=job.signature,
                        roles={k: v.model_dump() for k, v in job.roles.items()},
                        entrypoint=job.entrypoint,
                        config_hash=job.config_hash,
                        marginal_threshold=job.marginal_threshold,
                        backlog_target_s=job.backlog_target_s,
                        started_at=time.time() if now is None else now,
                    )
                )
            )

    def end_job(self, job_id: int, outcome: str, now: float | None = None) -> None:
        with self._tx() as conn:
            conn.execute(
                t.jobs.update()
                .where(t.jobs.c.id == job_id, t.jobs.c.ended_at.is_(None))
                .values(ended_at=time.time() if now is None else now, outcome=outcome)
            )

    def job(self, job_id: int) -> JobRow | None:
        with self._tx() as conn:
            row = conn.execute(sa.select(t.jobs).where(t.jobs.c.id == job_id)).first()
        return _job(row) if row else None

    def find_job(self, name: str, run_id: str | None = None) -> JobRow | None:
        """The run `run_id` of job `name`, or its newest run."""
        query = sa.select(t.jobs).where(t.jobs.c.name == name)
        if run_id is not None:
            query = query.where(t.jobs.c.run_id == run_id)
        with self._tx() as conn:
            row = conn.execute(
                query.order_by(t.jobs.c.started_at.desc(), t.jobs.c.id.desc()).limit(1)
            ).first()
        return _job(row) if row else None

    def running_jobs(self) -> list[JobRow]:
        with self._tx() as conn:
            rows = conn.execute(
                sa.select(t.jobs).where(t.jobs.c.ended_at.is_(None)).order_by(t.jobs.c.id)
            ).all()
        return [_job(r) for r in rows]

    def finished_jobs(self, signature: str | None = None, limit: int = 50) -> list[JobRow]:
        """Newest first."""
        query = sa.select(t.jobs).where(t.jobs.c.ended_at.is_not(None))
        if signature is not None:
            query = query.where(t.jobs.c.signature == signature)
        with self._tx() as conn:
            rows = conn.execute(
                query.order_by(t.jobs.c.ended_at.desc(), t.jobs.c.id.desc()).limit(limit)
            ).all()
        return [_job(r) for r in rows]

    # -- statistics -------------------------------------------------------------------------
    def add_samples(self, job_id: int, samples: Sequence[StatSample]) -> list[StatSample]:
        """Store the samples not stored yet (by `seq`); returns those that were new."""
        if not samples:
            return []
        with self._tx() as conn:
            seqs = [s.seq for s in samples]
            have = set(
                conn.execute(
                    sa.select(t.samples.c.seq).where(t.samples.c.job_id == job_id, t.samples.c.seq.in_(seqs))
                ).scalars()
            )
            fresh = {s.seq: s for s in samples if s.seq not in have}
            if fresh:
                conn.execute(
                    t.samples.insert(),
                    [
                        {"job_id": job_id, "seq": s.seq, **s.model_dump(include=set(SAMPLE_FIELDS))}
                        for s in fresh.values()
                    ],
                )
        return list(fresh.values())

    def samples(
        self, job_id: int, kind: str | None = None, since: float | None = None, limit: int = 100_000
    ) -> list[StatSample]:
        """Oldest first (the newest `limit`)."""
        query = sa.select(t.samples).where(t.samples.c.job_id == job_id)
        if kind is not None:
            query = query.where(t.samples.c.kind == kind)
        if since is not None:
            query = query.where(t.samples.c.time >= since)
        with self._tx() as conn:
            rows = conn.execute(
                query.order_by(t.samples.c.time.desc(), t.samples.c.seq.desc()).limit(limit)
            ).all()
        return [_sample(r) for r in reversed(rows)]

    def throughput_by_size(self, job_id: int, role: str) -> dict[int, float]:
        """Mean samples/s (steps/s where no samples/s was reported) at each world size of `role`."""
        speed = sa.func.coalesce(t.samples.c.samples_per_s, t.samples.c.steps_per_s)
        query = (
            sa.select(t.samples.c.world_size, sa.func.avg(speed))
            .where(
                t.samples.c.job_id == job_id,
                t.samples.c.kind == "throughput",
                t.samples.c.role == role,
                t.samples.c.world_size.is_not(None),
                speed.is_not(None),
            )
            .group_by(t.samples.c.world_size)
        )
        with self._tx() as conn:
            return {int(size): float(mean) for size, mean in conn.execute(query).all()}

    # -- optimize events --------------------------------------------------------------------
    def add_event(
        self, job_id: int, kind: str, role: str | None, detail: dict[str, Any], now: float | None = None
    ) -> int:
        with self._tx() as conn:
            return _new_id(
                conn.execute(
                    t.optimize_events.insert().values(
                        job_id=job_id,
                        time=time.time() if now is None else now,
                        kind=kind,
                        role=role,
                        detail=detail,
                        state="open",
                    )
                )
            )

    def set_event_state(self, event_id: int, state: str) -> None:
        with self._tx() as conn:
            conn.execute(
                t.optimize_events.update().where(t.optimize_events.c.id == event_id).values(state=state)
            )

    def events(self, job_id: int, state: str | None = None) -> list[EventRow]:
        query = sa.select(t.optimize_events).where(t.optimize_events.c.job_id == job_id)
        if state is not None:
            query = query.where(t.optimize_events.c.state == state)
        with self._tx() as conn:
            rows = conn.execute(query.order_by(t.optimize_events.c.id)).all()
        return [EventRow(r.id, r.job_id, r.time, r.kind, r.role, dict(r.detail), r.state) for r in rows]

    # -- plans ------------------------------------------------------------------------------
    def add_plan(
        self, job_id: int, plan: RolePlan, event_id: int | None = None, now: float | None = None
    ) -> int:
        """Write a plan; an older proposed plan of the same role is superseded."""
        with self._tx() as conn:
            conn.execute(
                t.plans.update()
                .where(t.plans.c.job_id == job_id, t.plans.c.role == plan.role, t.plans.c.state == "proposed")
                .values(state="superseded")
            )
            return _new_id(
                conn.execute(
                    t.plans.insert().values(
                        job_id=job_id,
                        event_id=event_id,
                        time=time.time() if now is None else now,
                        role=plan.role,
                        algorithm=plan.algorithm,
                        size=plan.size,
                        memory_bytes=plan.memory_bytes,
                        reason=plan.reason,
                        state=plan.state,
                    )
                )
            )

    def set_plan_state(self, plan_id: int, state: str, reason: str = "") -> None:
        with self._tx() as conn:
            values: dict[str, Any] = {"state": state}
            if reason:  # `+` on strings is || on both backends
                values["reason"] = t.plans.c.reason + f" [{state}: {reason}]"
            conn.execute(t.plans.update().where(t.plans.c.id == plan_id).values(**values))

    def acknowledge_plan(
        self, job_id: int, plan_id: int, state: str, reason: str = "", now: float | None = None
    ) -> None:
        """The job's answer to a plan (applied, unplaceable), with when it came: the time and the
        newest sample `seq` stored for the job by then, in the same transaction."""
        newest = (
            sa.select(sa.func.coalesce(sa.func.max(t.samples.c.seq), -1))
            .where(t.samples.c.job_id == job_id)
            .scalar_subquery()
        )
        values: dict[str, Any] = {
            "state": state,
            "acked_at": time.time() if now is None else now,
            "acked_seq": newest,
        }
        if reason:
            values["reason"] = t.plans.c.reason + f" [{state}: {reason}]"
        with self._tx() as conn:
            conn.execute(
                t.plans.update().where(t.plans.c.id == plan_id, t.plans.c.job_id == job_id).values(**values)
            )

    def applied_sizes(self, job_id: int) -> dict[str, AppliedSize]:
        """Per role, the newest plan with a size that the job answered as applied (by when the
        answer came; answers from before version 3 count as older than any since)."""
        query = sa.select(
            t.plans.c.id, t.plans.c.role, t.plans.c.size, t.plans.c.acked_at, t.plans.c.acked_seq
        ).where(t.plans.c.job_id == job_id, t.plans.c.state == "applied", t.plans.c.size.is_not(None))
        with self._tx() as conn:
            rows = conn.execute(query).all()
        newest: dict[str, AppliedSize] = {}
        for row in sorted(rows, key=lambda r: (r.acked_at is not None, r.acked_at or 0.0, r.id)):
            after = None if row.acked_seq is None else int(row.acked_seq)
            newest[row.role] = AppliedSize(row.role, int(row.size), int(row.id), after)
        return newest

    def plans(self, job_id: int) -> list[RolePlan]:
        """Every plan of the job, oldest first."""
        with self._tx() as conn:
            rows = conn.execute(
                sa.select(t.plans).where(t.plans.c.job_id == job_id).order_by(t.plans.c.id)
            ).all()
        return [_plan(r) for r in rows]

    def current_plans(self, job_id: int) -> list[RolePlan]:
        """The newest plan of each role."""
        newest: dict[str, RolePlan] = {}
        for plan in self.plans(job_id):
            newest[plan.role] = plan
        return list(newest.values())

    # -- cluster ----------------------------------------------------------------------------
    def add_cluster_sample(
        self,
        nodes_alive: int,
        nodes_dead: int,
        total: dict[str, float],
        available: dict[str, float],
        pending_demand: list[dict[str, float]],
        now: float | None = None,
    ) -> None:
        with self._tx() as conn:
            conn.execute(
                t.cluster_samples.insert().values(
                    time=time.time() if now is None else now,
                    nodes_alive=nodes_alive,
                    nodes_dead=nodes_dead,
                    total=total,
                    available=available,
                    pending_demand=pending_demand,
                )
            )

    def latest_cluster_sample(self) -> dict[str, Any] | None:
        with self._tx() as conn:
            row = conn.execute(
                sa.select(t.cluster_samples).order_by(t.cluster_samples.c.id.desc()).limit(1)
            ).first()
        return dict(row._mapping) if row else None


def _new_id(result: sa.CursorResult[Any]) -> int:
    key = result.inserted_primary_key
    if key is None:  # pragma: no cover - every table here has an integer key
        raise RuntimeError("insert returned no primary key")
    return int(key[0])


def _sqlite_pragmas(dbapi_connection: Any, _record: Any) -> None:
    cursor = dbapi_connection.cursor()
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.close()


def _job(row: sa.Row[Any]) -> JobRow:
    return JobRow(
        id=row.id,
        name=row.name,
        run_id=row.run_id,
        signature=row.signature,
        roles=dict(row.roles),
        entrypoint=row.entrypoint,
        config_hash=row.config_hash,
        started_at=row.started_at,
        ended_at=row.ended_at,
        outcome=row.outcome,
        marginal_threshold=row.marginal_threshold,
        backlog_target_s=row.backlog_target_s,
    )


def _sample(row: sa.Row[Any]) -> StatSample:
    data = {f: getattr(row, f) for f in SAMPLE_FIELDS}
    return StatSample(seq=row.seq, **{k: v for k, v in data.items() if v is not None})


def _plan(row: sa.Row[Any]) -> RolePlan:
    return RolePlan(
        id=row.id,
        role=row.role,
        size=row.size,
        memory_bytes=row.memory_bytes,
        algorithm=row.algorithm,
        reason=row.reason,
        state=row.state,
        time=row.time,
    )
