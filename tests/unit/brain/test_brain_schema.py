"""Each schema version is frozen: a database migrated to version N matches its snapshot fixture
(schema_vN.json), `schema.py` (what the queries use) matches what the migrations build, so neither
drifts, and a database of an older version, with its data, is migrated and read by today's Brain."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from dlu_brain import Brain, BrainDatabase, OptimizerSettings
from dlu_brain.db import schema
from dlu_brain.db.migrations import LATEST, migrate
from dlu_prime.brain_port import StatSample

pytestmark = pytest.mark.timeout(60)
HERE = Path(__file__).parent


def _shape(engine: sa.Engine) -> dict[str, Any]:
    insp = sa.inspect(engine)
    return {
        t: {
            "columns": [[c["name"], str(c["type"]), bool(c["nullable"])] for c in insp.get_columns(t)],
            "unique": sorted(sorted(u["column_names"]) for u in insp.get_unique_constraints(t)),
            "foreign_keys": sorted(
                [fk["constrained_columns"], fk["referred_table"]] for fk in insp.get_foreign_keys(t)
            ),
        }
        for t in sorted(insp.get_table_names())
    }


@pytest.mark.parametrize("version", range(1, LATEST + 1))
def test_each_version_matches_its_snapshot(version: int) -> None:
    engine = sa.create_engine("sqlite://")
    assert migrate(engine, target=version) == version
    assert _shape(engine) == json.loads((HERE / f"schema_v{version}.json").read_text())


def test_schema_module_matches_the_migrated_database() -> None:
    migrated = sa.create_engine("sqlite://")
    migrate(migrated)
    declared = sa.create_engine("sqlite://")
    schema.metadata.create_all(declared)
    assert _shape(declared) == _shape(migrated)


def test_a_database_with_data_survives_migrating_again(tmp_path: Path) -> None:
    engine = sa.create_engine(f"sqlite:///{tmp_path / 'b.sqlite'}")
    migrate(engine, target=1)
    with engine.begin() as conn:
        conn.execute(schema.jobs.insert().values(name="j", run_id="r", signature="s", roles={}, entrypoint="e",
                                                 config_hash="c", started_at=1.0))  # fmt: skip
    migrate(engine)
    with engine.connect() as conn:
        assert conn.execute(sa.select(schema.jobs.c.name)).scalars().all() == ["j"]


def test_a_version_1_database_loads_and_its_jobs_keep_the_brains_threshold(tmp_path: Path) -> None:
    """A Brain database from before jobs sent their threshold: migrated to today's schema on
    resume, its running job taken back, and planned with the Brain's own setting."""
    url = f"sqlite:///{tmp_path / 'old.sqlite'}"
    engine = sa.create_engine(url)
    migrate(engine, target=1)
    trainer = {"kind": "elastic", "size": 4, "min_size": 1, "max_size": 8, "elastic": True}
    with engine.begin() as conn:  # what a version-1 Brain wrote: no marginal_threshold column
        conn.execute(sa.text(
            "INSERT INTO jobs (name, run_id, signature, roles, entrypoint, config_hash, started_at) "
            "VALUES ('lm', 'r1', 's', :roles, 'train:main', 'c', 1.0)"
        ), {"roles": json.dumps({"trainer": trainer})})  # fmt: skip
        job_id = conn.execute(sa.text("SELECT id FROM jobs")).scalar_one()
        for seq, (size, speed) in enumerate([(3, 250.0)] * 3 + [(4, 300.0)] * 2, start=1):
            conn.execute(sa.text(
                "INSERT INTO stats_samples (job_id, seq, time, kind, role, world_size, samples_per_s) "
                "VALUES (:j, :seq, :seq, 'throughput', 'trainer', :n, :v)"
            ), {"j": job_id, "seq": seq, "n": size, "v": speed})  # fmt: skip
        conn.execute(sa.text(
            "INSERT INTO optimize_events (job_id, time, kind, role, detail, state) VALUES "
            "(:j, 1, 'job_start', NULL, '{}', 'no_change'), "
            "(:j, 2, 'throughput_measured', 'trainer', '{\"world_size\": 3}', 'no_change')"
        ), {"j": job_id})  # fmt: skip
    engine.dispose()
    for own, plan_size in ((0.7, 3), (0.3, 5)):  # the Brain's own setting decides
        copy = tmp_path / f"copy-{own}.sqlite"
        copy.write_bytes((tmp_path / "old.sqlite").read_bytes())
        brain = Brain(
            BrainDatabase(f"sqlite:///{copy}"), optimizer_settings=OptimizerSettings(linear_threshold=own)
        )
        assert brain.resume() == 1
        row = brain.db.find_job("lm", "r1")
        assert row is not None and row.marginal_threshold is None
        # the third sample at 4 nodes: measured; 3 -> 4 brought 50 of a linear 83.3 samples/s: 60%
        brain.add_samples("lm", "r1", [StatSample(seq=6, time=6.0, kind="throughput", role="trainer",
                                                  world_size=4, samples_per_s=300.0)])  # fmt: skip
        (plan,) = brain.plan("lm", "r1").roles
        assert plan.size == plan_size, plan.reason
        brain.db.close()


def test_a_version_2_database_loads_and_its_jobs_keep_the_brains_backlog_target(tmp_path: Path) -> None:
    """A Brain database from before jobs sent their backlog target and the Brain recorded when a
    plan was answered: migrated to today's schema on resume, its running job taken back at the
    size of its applied plan, its threshold kept, its backlog role planned with the Brain's own
    target (and from that size)."""
    url = f"sqlite:///{tmp_path / 'old.sqlite'}"
    engine = sa.create_engine(url)
    migrate(engine, target=2)
    prep = {"kind": "simple", "size": 1, "min_size": 1, "max_size": 32, "elastic": False}
    with engine.begin() as conn:  # what a version-2 Brain wrote: no backlog target, no acked_*
        conn.execute(sa.text(
            "INSERT INTO jobs (name, run_id, signature, roles, entrypoint, config_hash, started_at, "
            "marginal_threshold) VALUES ('feed', 'r1', 's', :roles, 'prep:main', 'c', 1.0, 0.7)"
        ), {"roles": json.dumps({"prep": prep})})  # fmt: skip
        job_id = conn.execute(sa.text("SELECT id FROM jobs")).scalar_one()
        conn.execute(sa.text(
            "INSERT INTO optimize_events (job_id, time, kind, role, detail, state) VALUES "
            "(:j, 1, 'job_start', NULL, '{}', 'no_change'), "
            "(:j, 2, 'throughput_measured', 'prep', '{\"world_size\": 1}', 'planned')"
        ), {"j": job_id})  # fmt: skip
        conn.execute(sa.text(
            "INSERT INTO plans (job_id, event_id, time, role, algorithm, size, reason, state) VALUES "
            "(:j, 2, 2, 'prep', 'backlog_sizing', 2, 'prep 1 -> 2: backlog', 'applied')"
        ), {"j": job_id})  # fmt: skip
        rows = [(1, "throughput", 1, 2.0, None)] * 3 + [(2, "throughput", 2, 4.0, None)] * 2
        rows += [(3, "backlog", None, None, 300)]
        for seq, (t, kind, size, speed, backlog) in enumerate(rows, start=1):
            conn.execute(sa.text(
                "INSERT INTO stats_samples (job_id, seq, time, kind, role, world_size, steps_per_s, "
                "channel, backlog) VALUES (:j, :seq, :t, :kind, 'prep', :n, :v, :c, :b)"
            ), {"j": job_id, "seq": seq, "t": t, "kind": kind, "n": size, "v": speed,
                "c": "q" if backlog else None, "b": backlog})  # fmt: skip
    engine.dispose()
    for own, plan_size in ((30.0, 5), (10.0, 15)):  # the Brain's own target decides
        copy = tmp_path / f"copy-{own}.sqlite"
        copy.write_bytes((tmp_path / "old.sqlite").read_bytes())
        brain = Brain(
            BrainDatabase(f"sqlite:///{copy}"), optimizer_settings=OptimizerSettings(backlog_target_s=own)
        )
        assert brain.resume() == 1
        row = brain.db.find_job("feed", "r1")
        assert row is not None and row.backlog_target_s is None and row.marginal_threshold == 0.7
        (status,) = brain.status()["jobs"]
        assert status["sizes"] == {"prep": 2} and status["backlog_target_s"] == own
        # the third sample at 2 actors: measured; 300 waiting at 2/s per actor
        brain.add_samples("feed", "r1", [StatSample(seq=7, time=3.0, kind="throughput", role="prep",
                                                    world_size=2, steps_per_s=4.0)])  # fmt: skip
        (plan,) = brain.plan("feed", "r1").roles
        assert (plan.size, plan.algorithm) == (plan_size, "backlog_sizing"), plan.reason
        assert plan.reason.startswith(f"prep 2 -> {plan_size}: ") and f"for {own:g} s" in plan.reason
        brain.db.close()
