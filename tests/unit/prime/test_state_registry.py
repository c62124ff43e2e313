"""Finding state stores by name through the `dlu.state_stores` entry-point group."""

from __future__ import annotations

import pickle

import pytest

from dlu_prime.state import (
    ENTRY_POINT_GROUP,
    EmbeddedStateStore,
    MemoryStateStore,
    StateConflictError,
    StateStoreError,
    available_state_stores,
    create_state_store,
)


def test_builtin_stores_are_registered() -> None:
    assert ENTRY_POINT_GROUP == "dlu.state_stores"
    assert {"memory", "embedded"} <= set(available_state_stores())


def test_create_memory_store() -> None:
    store = create_state_store("memory")
    assert isinstance(store, MemoryStateStore)
    assert store.put("job", b"x", None) == 1
    assert create_state_store("memory", {}).get("job") is None  # a fresh instance each call


def test_create_embedded_store_with_options_needs_no_ray() -> None:
    store = create_state_store("embedded", {"namespace": "custom"})
    assert isinstance(store, EmbeddedStateStore)
    assert store.namespace == "custom"


def test_unknown_name_lists_available_and_hints_the_package(monkeypatch: pytest.MonkeyPatch) -> None:
    """As on a machine where dlu-store-redis is not installed."""
    import importlib.metadata

    import dlu_prime.state.base as base

    def without_redis(group: str) -> importlib.metadata.EntryPoints:
        found = importlib.metadata.entry_points(group=group)
        return importlib.metadata.EntryPoints(ep for ep in found if ep.name != "redis")

    monkeypatch.setattr(base, "entry_points", without_redis)
    with pytest.raises(StateStoreError) as info:
        create_state_store("redis")
    message = str(info.value)
    assert "'redis'" in message
    assert "'embedded'" in message and "'memory'" in message
    assert "dlu-store-redis" in message
    assert ENTRY_POINT_GROUP in message
    assert info.value.operation == "create"


def test_unknown_other_name_still_suggests_how_stores_are_installed() -> None:
    with pytest.raises(StateStoreError, match=r"no state store named 'etcd'.*dlu-store-redis for 'redis'"):
        create_state_store("etcd")


def test_bad_option_names_the_store_and_the_option() -> None:
    with pytest.raises(StateStoreError) as info:
        create_state_store("memory", {"url": "redis://x"})
    message = str(info.value)
    assert "'memory'" in message and "'url'" in message
    assert "accepts no options" in message
    assert isinstance(info.value.__cause__, TypeError)


def test_bad_option_lists_the_accepted_ones() -> None:
    with pytest.raises(StateStoreError, match=r"'embedded'.*'namespce'.*accepted options: namespace"):
        create_state_store("embedded", {"namespce": "x"})


def test_bad_option_value_rejected_by_the_constructor() -> None:
    with pytest.raises(StateStoreError, match=r"'embedded'.*namespace must be a non-empty string"):
        create_state_store("embedded", {"namespace": ""})


def test_errors_survive_pickling() -> None:
    """Errors raised inside an actor reach the caller pickled; the fields must come along."""
    error = StateConflictError("memory", "put of job 'x'", "stale")
    copy = pickle.loads(pickle.dumps(error))
    assert type(copy) is StateConflictError
    assert (copy.store, copy.operation, copy.detail) == ("memory", "put of job 'x'", "stale")
    assert str(copy) == str(error) == "state store 'memory': put of job 'x' failed: stale"
