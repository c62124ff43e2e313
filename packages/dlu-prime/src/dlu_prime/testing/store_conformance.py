"""The contract every `StateStore` must meet, as a pytest suite that store packages run.

A store written outside this repository proves it keeps the contract by subclassing
`StateStoreConformance` in one of its own `test_*.py` modules:

    class TestMyStore(StateStoreConformance):
        def create_store(self, tmp_path: Path) -> StateStore:
            return create_state_store("my-store", {"root": str(tmp_path)})

or, where an empty store needs more setup, by overriding the `store` fixture. pytest is needed
only here, never by dlu-prime at runtime: install `dlu-prime[testing]` beside the store's tests.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

try:
    import pytest
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError(
        "dlu_prime.testing.store_conformance runs under pytest, which is not installed; "
        "install dlu-prime[testing] (or pytest) in the environment that runs the store's tests"
    ) from exc

from dlu_prime.state import Settled, StateConflictError, StateStore, Versioned, settle

__all__ = ["BAD_JOB_NAMES", "RACE_ROUNDS", "StateStoreConformance"]

RACE_ROUNDS = 20
BAD_JOB_NAMES = ["", "Upper", "a/b", "a_b", "a b", "job.x", "é", None, 3]


class StateStoreConformance:
    """Not collected by itself (no `Test` prefix); every subclass runs all of it.

    Each test gets an empty store from the `store` fixture, which by default calls
    `create_store` with the test's temporary directory and closes the store afterwards.
    """

    def create_store(self, tmp_path: Path) -> StateStore:
        """Return an empty store (`tmp_path` is the test's own directory, for file stores)."""
        raise NotImplementedError(
            f"{type(self).__name__} must override create_store(tmp_path) or the `store` fixture "
            "to return an empty store"
        )

    @pytest.fixture
    def store(self, tmp_path: Path) -> Iterator[StateStore]:
        made = self.create_store(tmp_path)
        try:
            yield made
        finally:
            made.close()

    def test_get_missing_job_is_none(self, store: StateStore) -> None:
        assert store.get("missing") is None

    def test_create_with_token_none(self, store: StateStore) -> None:
        assert store.put("job", b"v1", None) == 1
        assert store.get("job") == Versioned(b"v1", 1)

    def test_create_twice_conflicts(self, store: StateStore) -> None:
        store.put("job", b"first", None)
        with pytest.raises(StateConflictError, match="put") as info:
            store.put("job", b"second", None)
        assert info.value.store == store.name
        assert store.get("job") == Versioned(b"first", 1)

    def test_put_with_current_token_bumps_it(self, store: StateStore) -> None:
        token = store.put("job", b"v1", None)
        for n in range(2, 6):
            token = store.put("job", f"v{n}".encode(), token)
            assert token == n
        assert store.get("job") == Versioned(b"v5", 5)

    def test_put_with_stale_token_conflicts(self, store: StateStore) -> None:
        first = store.put("job", b"v1", None)
        second = store.put("job", b"v2", first)
        store.put("job", b"v3", second)
        for stale in (first, second, 99):
            with pytest.raises(StateConflictError):
                store.put("job", b"stale", stale)
        assert store.get("job") == Versioned(b"v3", 3)

    def test_put_with_token_on_missing_job_conflicts(self, store: StateStore) -> None:
        with pytest.raises(StateConflictError):
            store.put("job", b"v", 1)
        assert store.get("job") is None
        assert store.list_jobs() == []

    # The settle rule: a put that raised StateStoreUnavailableError is read back (`settle`)
    # before the next write. It relies on the contract above: a version holds exactly the bytes
    # written, and a late write with an older token never lands over a newer version.
    def test_settle_finds_a_write_that_landed(self, store: StateStore) -> None:
        first = store.put("job", b"v1", None)
        second = store.put("job", b"v2", first)  # its reply "lost": the writer does not know
        assert settle(store, "job", first, b"other attempt", b"v2") == Settled(True, second)

    def test_settle_of_a_write_that_did_not_land_keeps_the_token(self, store: StateStore) -> None:
        first = store.put("job", b"v1", None)
        assert settle(store, "job", first, b"v2") == Settled(False, first)
        assert settle(store, "new", None, b"v1") == Settled(False, None)

    def test_settle_after_another_writer_conflicts(self, store: StateStore) -> None:
        first = store.put("job", b"v1", None)
        store.put("job", b"theirs", first)
        with pytest.raises(StateConflictError, match="settle"):
            settle(store, "job", first, b"mine")

    def test_a_late_write_after_a_settled_one_never_lands(self, store: StateStore) -> None:
        first = store.put("job", b"v1", None)
        second = store.put("job", b"v2", first)  # written after settling "v1.5" as not landed
        with pytest.raises(StateConflictError):
            store.put("job", b"v1.5", first)  # the hung server executes the old write now
        assert store.get("job") == Versioned(b"v2", second)

    def test_racing_writers_exactly_one_wins(self, store: StateStore) -> None:
        token = store.put("race", b"start", None)
        for round_ in range(RACE_ROUNDS):
            won, lost = _race(store, "race", token, [f"w{i}-{round_}".encode() for i in range(2)])
            assert len(won) == 1, f"round {round_}: {len(won)} writers won"
            assert len(lost) == 1 and isinstance(lost[0], StateConflictError)
            data, token = won[0]
            assert token == round_ + 2
            assert store.get("race") == Versioned(data, token)

    def test_delete_with_matching_token(self, store: StateStore) -> None:
        token = store.put("job", b"v1", None)
        token = store.put("job", b"v2", token)
        store.delete("job", token)
        assert store.get("job") is None
        assert store.list_jobs() == []

    def test_delete_with_stale_token_conflicts(self, store: StateStore) -> None:
        first = store.put("job", b"v1", None)
        store.put("job", b"v2", first)
        with pytest.raises(StateConflictError, match="delete"):
            store.delete("job", first)
        assert store.get("job") == Versioned(b"v2", 2)

    def test_delete_without_token_is_unconditional(self, store: StateStore) -> None:
        token = store.put("job", b"v1", None)
        store.put("job", b"v2", token)
        store.delete("job")
        assert store.get("job") is None
        assert store.list_jobs() == []

    def test_delete_missing_job_is_not_an_error(self, store: StateStore) -> None:
        store.delete("missing")
        store.delete("missing", 3)
        assert store.get("missing") is None

    def test_recreate_after_delete_starts_at_one(self, store: StateStore) -> None:
        token = store.put("job", b"old", None)
        store.put("job", b"older", token)
        store.delete("job")
        assert store.put("job", b"new", None) == 1
        assert store.get("job") == Versioned(b"new", 1)

    def test_stale_token_after_delete_and_recreate_conflicts(self, store: StateStore) -> None:
        old = store.put("job", b"old", None)
        store.delete("job")
        store.put("job", b"new", None)
        store.put("job", b"newer", 1)
        with pytest.raises(StateConflictError):
            store.put("job", b"stale", old)
        assert store.get("job") == Versioned(b"newer", 2)

    def test_list_jobs_sorted_without_deleted(self, store: StateStore) -> None:
        assert store.list_jobs() == []
        for job in ["zeta", "alpha", "mid-1", "b2"]:
            store.put(job, job.encode(), None)
        token = store.put("alpha", b"again", 1)
        assert store.list_jobs() == ["alpha", "b2", "mid-1", "zeta"]
        store.delete("mid-1")
        store.delete("alpha", token)
        assert store.list_jobs() == ["b2", "zeta"]

    def test_jobs_with_shared_prefix_are_isolated(self, store: StateStore) -> None:
        store.put("a", b"job a", None)
        assert store.get("ab") is None
        store.put("ab", b"job ab", None)
        assert store.put("ab", b"job ab v2", 1) == 2
        assert store.get("a") == Versioned(b"job a", 1)
        assert store.get("ab") == Versioned(b"job ab v2", 2)
        with pytest.raises(StateConflictError):
            store.put("a", b"x", 2)
        store.delete("a")
        assert store.get("ab") == Versioned(b"job ab v2", 2)
        assert store.list_jobs() == ["ab"]
        store.delete("ab", 2)
        assert store.list_jobs() == []

    def test_large_document_round_trips(self, store: StateStore) -> None:
        big = bytes(range(256)) * 4096  # 1 MiB
        token = store.put("big", big, None)
        assert store.get("big") == Versioned(big, token)
        bigger = big + b"tail"
        assert store.put("big", bigger, token) == token + 1
        got = store.get("big")
        assert got is not None and got.data == bigger

    def test_binary_bytes_round_trip(self, store: StateStore) -> None:
        every_byte = bytes(range(256))
        store.put("bin", every_byte, None)
        store.put("empty", b"", None)
        assert store.get("bin") == Versioned(every_byte, 1)
        assert store.get("empty") == Versioned(b"", 1)

    @pytest.mark.parametrize("bad", BAD_JOB_NAMES)
    def test_invalid_job_names_raise_value_error(self, store: StateStore, bad: object) -> None:
        with pytest.raises(ValueError, match="job"):
            store.get(bad)  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="job"):
            store.put(bad, b"x", None)  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="job"):
            store.delete(bad)  # type: ignore[arg-type]
        assert store.list_jobs() == []

    @pytest.mark.parametrize("bad", [0, -1, True, "1", 1.0])
    def test_invalid_tokens_raise_value_error(self, store: StateStore, bad: object) -> None:
        with pytest.raises(ValueError, match="token"):
            store.put("job", b"x", bad)  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="token"):
            store.delete("job", bad)  # type: ignore[arg-type]
        assert store.get("job") is None

    def test_non_bytes_data_raises_type_error(self, store: StateStore) -> None:
        with pytest.raises(TypeError, match="data"):
            store.put("job", "text", None)  # type: ignore[arg-type]
        assert store.get("job") is None


def _race(
    store: StateStore, job: str, token: int, payloads: list[bytes]
) -> tuple[list[tuple[bytes, int]], list[BaseException]]:
    """Start one writer thread per payload, all with `token`, released together by a barrier.

    Returns the (data, new token) of the winners and the exceptions of the losers.
    """
    barrier = threading.Barrier(len(payloads))
    won: list[tuple[bytes, int]] = []
    lost: list[BaseException] = []

    def write(data: bytes) -> None:
        try:
            barrier.wait(timeout=10)
            won.append((data, store.put(job, data, token)))
        except BaseException as exc:  # checked by the caller
            lost.append(exc)

    threads = [threading.Thread(target=write, args=(data,)) for data in payloads]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert not any(thread.is_alive() for thread in threads), "a writer hung"
    return won, lost
