"""Schema migrations: an ordered list of steps, each run once in one transaction and recorded in
`dlu_schema_version`.

Why not Alembic: the Brain's migrations are few additive steps run by the Brain itself at start,
the same on SQLite and PostgreSQL; Alembic's script folder, env.py and autogenerate add machinery
(and a second configuration to ship in the wheel) that such steps do not need. Each step here is
frozen: it spells out its own DDL and never reads `schema.py`, which moves on with later steps.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

import sqlalchemy as sa

logger = logging.getLogger(__name__)


class SchemaTooNewError(RuntimeError):
    """The database was migrated by a newer dlu-brain than this one."""


@dataclass(frozen=True)
class Migration:
    version: int
    description: str
    apply: Callable[[sa.Connection], None]


def _v1_tables(conn: sa.Connection) -> None:
    """The first schema (tests/unit/brain/schema_v1.json is its snapshot)."""
    md = sa.MetaData()
    sa.Table(
        "jobs", md,
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("name", sa.String(200), nullable=False),
        sa.Column("run_id", sa.String(100), nullable=False),
        sa.Column("signature", sa.String(64), nullable=False, index=True),
        sa.Column("roles", sa.JSON, nullable=False),
        sa.Column("entrypoint", sa.Text, nullable=False),
        sa.Column("config_hash", sa.String(64), nullable=False),
        sa.Column("started_at", sa.Float, nullable=False),
        sa.Column("ended_at", sa.Float, nullable=True),
        sa.Column("outcome", sa.String(40), nullable=True),
        sa.UniqueConstraint("name", "run_id", name="uq_jobs_name_run"),
    )  # fmt: skip
    sa.Table(
        "stats_samples", md,
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("job_id", sa.Integer, sa.ForeignKey("jobs.id", ondelete="CASCADE"), nullable=False),
        sa.Column("seq", sa.BigInteger, nullable=False),
        sa.Column("time", sa.Float, nullable=False),
        sa.Column("kind", sa.String(20), nullable=False),
        sa.Column("role", sa.String(200), nullable=True),
        sa.Column("world_size", sa.Integer, nullable=True),
        sa.Column("steps_per_s", sa.Float, nullable=True),
        sa.Column("samples_per_s", sa.Float, nullable=True),
        sa.Column("actor", sa.String(200), nullable=True),
        sa.Column("node_id", sa.String(100), nullable=True),
        sa.Column("cpu_percent", sa.Float, nullable=True),
        sa.Column("memory_bytes", sa.BigInteger, nullable=True),
        sa.Column("memory_limit_bytes", sa.BigInteger, nullable=True),
        sa.Column("gpu_percent", sa.Float, nullable=True),
        sa.Column("gpu_memory_bytes", sa.BigInteger, nullable=True),
        sa.Column("channel", sa.String(200), nullable=True),
        sa.Column("backlog", sa.Integer, nullable=True),
        sa.UniqueConstraint("job_id", "seq", name="uq_samples_job_seq"),
    )  # fmt: skip
    sa.Table(
        "optimize_events", md,
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("job_id", sa.Integer, sa.ForeignKey("jobs.id", ondelete="CASCADE"), nullable=False),
        sa.Column("time", sa.Float, nullable=False),
        sa.Column("kind", sa.String(40), nullable=False),
        sa.Column("role", sa.String(200), nullable=True),
        sa.Column("detail", sa.JSON, nullable=False),
        sa.Column("state", sa.String(20), nullable=False),
    )  # fmt: skip
    sa.Table(
        "plans", md,
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("job_id", sa.Integer, sa.ForeignKey("jobs.id", ondelete="CASCADE"), nullable=False),
        sa.Column("event_id", sa.Integer, sa.ForeignKey("optimize_events.id"), nullable=True),
        sa.Column("time", sa.Float, nullable=False),
        sa.Column("role", sa.String(200), nullable=False),
        sa.Column("algorithm", sa.String(60), nullable=False),
        sa.Column("size", sa.Integer, nullable=True),
        sa.Column("memory_bytes", sa.BigInteger, nullable=True),
        sa.Column("reason", sa.Text, nullable=False),
        sa.Column("state", sa.String(20), nullable=False),
    )  # fmt: skip
    sa.Table(
        "cluster_samples", md,
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("time", sa.Float, nullable=False),
        sa.Column("nodes_alive", sa.Integer, nullable=False),
        sa.Column("nodes_dead", sa.Integer, nullable=False),
        sa.Column("total", sa.JSON, nullable=False),
        sa.Column("available", sa.JSON, nullable=False),
        sa.Column("pending_demand", sa.JSON, nullable=False),
    )  # fmt: skip
    md.create_all(conn)


def _v2_job_threshold(conn: sa.Connection) -> None:
    """The job's own marginal threshold (NULL for the jobs registered before it: the Brain's
    setting plans them). Plain DDL: ADD COLUMN of a nullable column is the same on both backends."""
    conn.execute(sa.text("ALTER TABLE jobs ADD COLUMN marginal_threshold FLOAT"))


def _v3_backlog_target_and_acks(conn: sa.Connection) -> None:
    """The job's own backlog target (NULL: the Brain's), and when the job's answer to a plan
    arrived: `acked_at` (the Brain's clock) and `acked_seq`, the newest sample number the Brain
    held for the job then (-1: none), so a restarted Brain knows whether the job's last sample or
    its last applied plan came later. NULL for the plans answered before: their order is unknown."""
    conn.execute(sa.text("ALTER TABLE jobs ADD COLUMN backlog_target_s FLOAT"))
    conn.execute(sa.text("ALTER TABLE plans ADD COLUMN acked_at FLOAT"))
    conn.execute(sa.text("ALTER TABLE plans ADD COLUMN acked_seq BIGINT"))


MIGRATIONS: tuple[Migration, ...] = (
    Migration(1, "jobs, statistics samples, optimize events, plans, cluster samples", _v1_tables),
    Migration(2, "jobs.marginal_threshold: the job's own share of linear scaling", _v2_job_threshold),
    Migration(
        3,
        "jobs.backlog_target_s: the job's own backlog target; plans.acked_at/acked_seq: when the job answered",
        _v3_backlog_target_and_acks,
    ),
)
LATEST = MIGRATIONS[-1].version

_version_table = sa.Table(
    "dlu_schema_version",
    sa.MetaData(),
    sa.Column("version", sa.Integer, primary_key=True, autoincrement=False),
    sa.Column("description", sa.String(200), nullable=False),
    sa.Column("applied_at", sa.Float, nullable=False),
)


def current_version(conn: sa.Connection) -> int:
    """0 for an empty database."""
    if not sa.inspect(conn).has_table(_version_table.name):
        return 0
    return int(
        conn.execute(sa.select(sa.func.coalesce(sa.func.max(_version_table.c.version), 0))).scalar_one()
    )


def migrate(engine: sa.Engine, target: int = LATEST) -> int:
    """Bring the database to `target`, step by step; returns the version it is at.

    Raises:
        SchemaTooNewError: the database is at a version this dlu-brain does not know.
    """
    with engine.begin() as conn:
        _version_table.create(conn, checkfirst=True)
        at = current_version(conn)
    if at > LATEST:
        raise SchemaTooNewError(
            f"the Brain database is at schema version {at}, newer than this dlu-brain knows ({LATEST}); "
            "upgrade dlu-brain (`pip install -U dlu-brain`) or point --db at another database"
        )
    for step in MIGRATIONS:
        if at < step.version <= target:
            with engine.begin() as conn:
                if current_version(conn) >= step.version:  # another Brain migrated it meanwhile
                    continue
                step.apply(conn)
                conn.execute(
                    _version_table.insert().values(
                        version=step.version, description=step.description, applied_at=time.time()
                    )
                )
            logger.info("Brain database migrated to schema version %d (%s)", step.version, step.description)
            at = step.version
    return at
