"""The conformance suite against a real Redis-compatible server started by the test."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from dlu_prime.state import StateStore
from dlu_prime.testing.store_conformance import StateStoreConformance
from dlu_store_redis.store import RedisStateStore
from dlu_store_redis.testing import RedisServer

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(scope="module")
def server() -> Iterator[RedisServer]:
    with RedisServer() as running:
        yield running


class TestRedisStore(StateStoreConformance):
    @pytest.fixture
    def store(self, server: RedisServer) -> Iterator[StateStore]:
        """An empty store: a key prefix no other test uses, its keys removed afterwards."""
        prefix = f"test-{uuid.uuid4().hex[:12]}"
        with RedisStateStore(url=server.url, key_prefix=prefix) as store:
            yield store
        with server.client() as client:
            keys = list(client.scan_iter(match=f"{prefix}:*"))
            if keys:
                client.delete(*keys)
