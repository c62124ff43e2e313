"""The Brain's database (SQLite by default, PostgreSQL by URL) and its migrations."""

from dlu_brain.db.migrations import LATEST, SchemaTooNewError, migrate
from dlu_brain.db.store import (
    AppliedSize,
    BrainDatabase,
    DatabaseUnavailableError,
    EventRow,
    JobRow,
    check_url,
    default_sqlite_url,
)

__all__ = [
    "LATEST",
    "AppliedSize",
    "BrainDatabase",
    "DatabaseUnavailableError",
    "EventRow",
    "JobRow",
    "SchemaTooNewError",
    "check_url",
    "default_sqlite_url",
    "migrate",
]
