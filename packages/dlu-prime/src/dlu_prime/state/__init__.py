"""Per-job state documents with compare-and-set writes, and the registry that finds stores
by name (entry-point group `dlu.state_stores`)."""

from dlu_prime.state.base import (
    ENTRY_POINT_GROUP,
    Settled,
    StateConflictError,
    StateStore,
    StateStoreError,
    StateStoreUnavailableError,
    Versioned,
    available_state_stores,
    create_state_store,
    describe_conflict,
    settle,
    validate_data,
    validate_job,
    validate_token,
)
from dlu_prime.state.embedded import EmbeddedStateStore
from dlu_prime.state.memory import MemoryStateStore

__all__ = [
    "ENTRY_POINT_GROUP",
    "EmbeddedStateStore",
    "MemoryStateStore",
    "Settled",
    "StateConflictError",
    "StateStore",
    "StateStoreError",
    "StateStoreUnavailableError",
    "Versioned",
    "available_state_stores",
    "create_state_store",
    "describe_conflict",
    "settle",
    "validate_data",
    "validate_job",
    "validate_token",
]
