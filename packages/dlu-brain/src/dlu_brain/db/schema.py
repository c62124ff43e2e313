"""The Brain's tables as they are now (SQLAlchemy Core). The migrations build them; a test proves
that a database migrated from empty has exactly these columns, so the two cannot drift."""

from __future__ import annotations

import sqlalchemy as sa

metadata = sa.MetaData()

schema_version = sa.Table(
    "dlu_schema_version",
    metadata,
    sa.Column("version", sa.Integer, primary_key=True, autoincrement=False),
    sa.Column("description", sa.String(200), nullable=False),
    sa.Column("applied_at", sa.Float, nullable=False),
)

jobs = sa.Table(
    "jobs",
    metadata,
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
    # The job spec's autoscale.marginal_threshold (version 2); NULL: the Brain's own setting.
    sa.Column("marginal_threshold", sa.Float, nullable=True),
    # The job spec's autoscale.backlog_target_s (version 3); NULL: the Brain's own setting.
    sa.Column("backlog_target_s", sa.Float, nullable=True),
    sa.UniqueConstraint("name", "run_id", name="uq_jobs_name_run"),
)

samples = sa.Table(
    "stats_samples",
    metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("job_id", sa.Integer, sa.ForeignKey("jobs.id", ondelete="CASCADE"), nullable=False),
    # The reporter's own sequence number: a batch sent again after a lost answer adds nothing.
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
)

optimize_events = sa.Table(
    "optimize_events",
    metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("job_id", sa.Integer, sa.ForeignKey("jobs.id", ondelete="CASCADE"), nullable=False),
    sa.Column("time", sa.Float, nullable=False),
    sa.Column("kind", sa.String(40), nullable=False),
    sa.Column("role", sa.String(200), nullable=True),
    sa.Column("detail", sa.JSON, nullable=False),
    sa.Column("state", sa.String(20), nullable=False),
)

plans = sa.Table(
    "plans",
    metadata,
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
    # When the job's answer (applied, unplaceable) arrived, and the newest sample `seq` the Brain
    # held for the job then (-1: none); version 3, NULL for the plans answered before it.
    sa.Column("acked_at", sa.Float, nullable=True),
    sa.Column("acked_seq", sa.BigInteger, nullable=True),
)

cluster_samples = sa.Table(
    "cluster_samples",
    metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("time", sa.Float, nullable=False),
    sa.Column("nodes_alive", sa.Integer, nullable=False),
    sa.Column("nodes_dead", sa.Integer, nullable=False),
    sa.Column("total", sa.JSON, nullable=False),
    sa.Column("available", sa.JSON, nullable=False),
    sa.Column("pending_demand", sa.JSON, nullable=False),
)
