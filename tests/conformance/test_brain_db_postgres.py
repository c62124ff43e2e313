"""The Brain's database conformance suite on a real PostgreSQL server the tests start (Debian's
`postgresql`, installed by .ci/run; see dlu_brain.testing.postgres), one fresh database per test."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa

from dlu_brain.db import BrainDatabase
from dlu_brain.testing.db_conformance import BrainDatabaseConformance
from dlu_brain.testing.postgres import PostgresServer, PostgresUnavailable

pytestmark = [pytest.mark.timeout(180), pytest.mark.slow]


@pytest.fixture(scope="module")
def postgres() -> Iterator[PostgresServer]:
    try:
        server = PostgresServer()
        server.start()
    except PostgresUnavailable as exc:
        pytest.skip(f"no PostgreSQL server can be started here: {exc}")
    try:
        yield server
    finally:
        server.close()


def fresh_database(server: PostgresServer) -> str:
    name = f"t_{uuid.uuid4().hex[:12]}"
    admin = sa.create_engine(server.url, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(sa.text(f'CREATE DATABASE "{name}"'))
    admin.dispose()
    return server.url.rsplit("/", 1)[0] + f"/{name}"


class TestPostgresBrainDatabase(BrainDatabaseConformance):
    @pytest.fixture(autouse=True)
    def _server(self, postgres: PostgresServer) -> None:
        self.server = postgres

    def create_database(self, tmp_path: Path) -> BrainDatabase:
        return BrainDatabase(fresh_database(self.server))
