"""The conformance suite against the store kept in Ray's GCS internal KV, plus the races and
failures that only this store's CAS-from-put-if-absent design can have."""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from dlu_prime.state import (
    EmbeddedStateStore,
    StateConflictError,
    StateStore,
    StateStoreError,
    StateStoreUnavailableError,
    Versioned,
)
from dlu_prime.testing.store_conformance import StateStoreConformance

pytestmark = [pytest.mark.ray, pytest.mark.timeout(60)]


@pytest.fixture
def namespace(ray_session: Any) -> Iterator[str]:
    """A fresh KV namespace per test, so tests never see each other's jobs."""
    name = f"dlu-test-{uuid.uuid4().hex[:12]}"
    yield name
    cleanup = EmbeddedStateStore(namespace=name)
    for job in cleanup.list_jobs():
        cleanup.delete(job)


def _raw_keys(namespace: str, job: str) -> list[bytes]:
    from ray.experimental import internal_kv

    return sorted(internal_kv._internal_kv_list(f"state/{job}/", namespace=namespace))  # pyright: ignore[reportPrivateUsage]


class TestEmbeddedStore(StateStoreConformance):
    @pytest.fixture
    def store(self, namespace: str) -> StateStore:
        return EmbeddedStateStore(namespace=namespace)

    def test_only_the_newest_version_is_kept(self, store: StateStore, namespace: str) -> None:
        token = store.put("job", b"v1", None)
        for n in range(2, 5):
            token = store.put("job", f"v{n}".encode(), token)
        assert _raw_keys(namespace, "job") == [b"state/job/000000000004"]

    def test_namespaces_are_isolated(self, store: StateStore, namespace: str) -> None:
        store.put("job", b"mine", None)
        other = EmbeddedStateStore(namespace=f"{namespace}-other")
        assert other.get("job") is None
        assert other.list_jobs() == []


class TestEmbeddedStoreRaces:
    """Replays interleavings that threads hit only rarely, by showing `put` an old listing."""

    @pytest.fixture
    def store(self, namespace: str) -> EmbeddedStateStore:
        return EmbeddedStateStore(namespace=namespace)

    def _stale_first_listing(
        self, monkeypatch: pytest.MonkeyPatch, store: EmbeddedStateStore, seen: list[int]
    ) -> None:
        real = store._tokens  # pyright: ignore[reportPrivateUsage]
        calls = iter([seen])

        def tokens(op: str, job: str) -> list[int]:
            return next(calls, None) or real(op, job)

        monkeypatch.setattr(store, "_tokens", tokens)

    def test_stale_writer_cannot_resurrect_a_collected_version(
        self, store: EmbeddedStateStore, namespace: str, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        token = 0
        for n in range(1, 6):
            token = store.put("job", f"v{n}".encode(), token or None)
        # A writer holding token 3 checked the listing while 3 was newest; by the time it
        # creates key 4, two newer writes have landed and key 4 was garbage-collected.
        self._stale_first_listing(monkeypatch, store, [3])
        with pytest.raises(StateConflictError, match="token 5 was written concurrently"):
            store.put("job", b"stale", 3)
        assert store.get("job") == Versioned(b"v5", 5)
        assert _raw_keys(namespace, "job") == [b"state/job/000000000005"]

    def test_put_racing_a_delete_is_rolled_back(
        self, store: EmbeddedStateStore, namespace: str, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        store.put("job", b"v1", None)
        store.delete("job")
        self._stale_first_listing(monkeypatch, store, [1])
        with pytest.raises(StateConflictError, match="deleted concurrently"):
            store.put("job", b"late", 1)
        assert store.get("job") is None
        assert _raw_keys(namespace, "job") == []

    def test_newest_version_vanishing_during_get_is_reread(
        self, store: EmbeddedStateStore, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        store.put("job", b"v1", None)
        store.put("job", b"v2", 1)
        self._stale_first_listing(monkeypatch, store, [1])  # key 1 is already collected
        assert store.get("job") == Versioned(b"v2", 2)


class TestEmbeddedStoreFailures:
    def test_data_survives_the_death_of_its_writer(self, ray_session: Any, namespace: str) -> None:
        ray = ray_session

        @ray.remote(num_cpus=0, max_restarts=0)
        class Writer:
            def save(self, ns: str) -> tuple[int, int]:
                return os.getpid(), EmbeddedStateStore(namespace=ns).put("job", b"from the actor", None)

        writer = Writer.remote()
        pid, token = ray.get(writer.save.remote(namespace), timeout=30)
        assert pid != os.getpid()
        ray.kill(writer, no_restart=True)
        deadline = time.monotonic() + 10
        while _alive(pid):
            assert time.monotonic() < deadline, f"writer process {pid} still alive after ray.kill"
            time.sleep(0.05)

        store = EmbeddedStateStore(namespace=namespace)
        assert store.get("job") == Versioned(b"from the actor", token)
        assert store.put("job", b"successor", token) == token + 1
        with pytest.raises(StateConflictError):
            store.put("job", b"dead writer", token)

    def test_without_ray_the_store_is_unavailable(self, monkeypatch: pytest.MonkeyPatch) -> None:
        import ray

        monkeypatch.setattr(ray, "is_initialized", lambda: False)
        store = EmbeddedStateStore()
        with pytest.raises(StateStoreUnavailableError, match=r"ray\.init\(\)") as info:
            store.get("job")
        assert info.value.store == "embedded"
        assert info.value.operation == "get of job 'job'"

    def test_ray_errors_are_translated(self, ray_session: Any, monkeypatch: pytest.MonkeyPatch) -> None:
        from ray.exceptions import RpcError
        from ray.experimental import internal_kv

        def unreachable(*_: object, **__: object) -> None:
            raise RpcError("GCS went away")

        def broken(*_: object, **__: object) -> None:
            raise RuntimeError("unexpected")

        store = EmbeddedStateStore(namespace="dlu-test-errors")
        monkeypatch.setattr(internal_kv, "_internal_kv_list", unreachable)
        with pytest.raises(StateStoreUnavailableError, match="GCS went away"):
            store.list_jobs()
        monkeypatch.setattr(internal_kv, "_internal_kv_list", broken)
        with pytest.raises(StateStoreError, match="RuntimeError: unexpected") as info:
            store.get("job")
        assert type(info.value) is StateStoreError

    def test_bad_namespace_is_rejected(self) -> None:
        with pytest.raises(ValueError, match="namespace"):
            EmbeddedStateStore(namespace="")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie still answers signal 0; it is dead for our purpose.
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split(") ", 1)[1][0] != "Z"
    except OSError:
        return False
