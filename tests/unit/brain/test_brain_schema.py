"""The first schema is frozen: a database migrated to version 1 matches the snapshot fixture, and
`schema.py` (what the queries use) matches what the migrations build, so neither drifts."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from dlu_brain.db import schema
from dlu_brain.db.migrations import migrate

pytestmark = pytest.mark.timeout(60)
SNAPSHOT = Path(__file__).with_name("schema_v1.json")


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


def test_version_1_matches_its_snapshot() -> None:
    engine = sa.create_engine("sqlite://")
    assert migrate(engine, target=1) == 1
    assert _shape(engine) == json.loads(SNAPSHOT.read_text())


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
