"""The Brain's database conformance suite on SQLite (the default: a file, nothing to install)."""

from __future__ import annotations

from pathlib import Path

import pytest

from dlu_brain.db import BrainDatabase
from dlu_brain.testing.db_conformance import BrainDatabaseConformance

pytestmark = pytest.mark.timeout(120)


class TestSQLiteBrainDatabase(BrainDatabaseConformance):
    def create_database(self, tmp_path: Path) -> BrainDatabase:
        return BrainDatabase(f"sqlite:///{tmp_path / 'sub' / 'brain.sqlite'}")
