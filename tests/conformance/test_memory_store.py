"""The conformance suite against the in-process store, found by its registered name."""

from __future__ import annotations

from pathlib import Path

from dlu_prime.state import StateStore, create_state_store
from dlu_prime.testing.store_conformance import StateStoreConformance


class TestMemoryStore(StateStoreConformance):
    def create_store(self, tmp_path: Path) -> StateStore:
        return create_state_store("memory")
