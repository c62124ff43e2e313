"""The conformance suite against the in-process store."""

from __future__ import annotations

import pytest

from dlu_prime.state import MemoryStateStore, StateStore

from .state_store_suite import StateStoreConformance


class TestMemoryStore(StateStoreConformance):
    @pytest.fixture
    def store(self) -> StateStore:
        return MemoryStateStore()
