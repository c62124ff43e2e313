"""What the Redis store does beyond the conformance suite: authentication, databases, outages,
racing PrimeMasters, key prefixes, retention, the entry point and the script cache."""

from __future__ import annotations

import os
import pickle
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from dlu_prime.state import (
    StateConflictError,
    StateStoreError,
    StateStoreUnavailableError,
    Versioned,
    available_state_stores,
    create_state_store,
)
from dlu_store_redis.store import RedisStateStore
from dlu_store_redis.testing import RedisServer

pytestmark = pytest.mark.timeout(60)

PASSWORD = "s3cret-Pa55"
FAST_RETRY: dict[str, Any] = {"retries": 2, "retry_backoff_s": 0.02, "connect_timeout_s": 1.0}


@pytest.fixture(scope="module")
def server() -> Iterator[RedisServer]:
    with RedisServer() as running:
        yield running


@pytest.fixture
def prefix(server: RedisServer) -> Iterator[str]:
    name = f"test-{uuid.uuid4().hex[:12]}"
    yield name
    for db in (0, 3):
        with server.client(db) as client:
            keys = list(client.scan_iter(match=f"{name}*"))
            if keys:
                client.delete(*keys)


@pytest.fixture
def store(server: RedisServer, prefix: str) -> Iterator[RedisStateStore]:
    with RedisStateStore(url=server.url, key_prefix=prefix) as opened:
        yield opened


def test_each_job_is_one_hash_under_the_prefix(
    store: RedisStateStore, server: RedisServer, prefix: str
) -> None:
    store.put("job-1", b"doc", None)
    with server.client() as client:
        assert client.type(f"{prefix}:job:job-1") == b"hash"
        stored = client.hgetall(f"{prefix}:job:job-1")
    assert stored[b"token"] == b"1" and stored[b"data"] == b"doc"
    assert set(stored) == {b"token", b"data", b"writer"}


@pytest.fixture(scope="module")
def secured() -> Iterator[RedisServer]:
    with RedisServer(password=PASSWORD) as running:
        yield running


class TestAuthentication:
    def test_right_password_works(self, secured: RedisServer) -> None:
        with RedisStateStore(url=secured.url, password=PASSWORD, key_prefix="auth-1") as store:
            assert store.put("job", b"v", None) == 1
        with RedisStateStore(url=secured.url_for(with_password=True), key_prefix="auth-1") as store:
            assert store.get("job") == Versioned(b"v", 1)

    def test_password_option_overrides_the_url(self, secured: RedisServer) -> None:
        url = secured.url.replace("redis://", "redis://:stale-password@")
        with RedisStateStore(url=url, password=PASSWORD, key_prefix="auth-2") as store:
            assert store.list_jobs() == []

    @pytest.mark.parametrize("password", ["wrong-Pa55", None])
    def test_wrong_or_missing_password_is_a_clear_error(
        self, secured: RedisServer, password: str | None
    ) -> None:
        with (
            RedisStateStore(url=secured.url, password=password, **FAST_RETRY) as store,
            pytest.raises(StateStoreError) as info,
        ):
            store.get("job")
        error = info.value
        assert type(error) is StateStoreError  # not retried as an outage: it will not heal
        assert error.store == "redis" and error.operation == "get of job 'job'"
        assert "refused the credentials" in str(error) and f"127.0.0.1:{secured.port}" in str(error)
        assert "wrong-Pa55" not in str(error) and PASSWORD not in str(error)

    def test_password_never_appears_in_repr_or_pickle_errors(self, secured: RedisServer) -> None:
        store = RedisStateStore(url=secured.url_for(with_password=True))
        assert PASSWORD not in repr(store)
        with pytest.raises(ValueError, match="database") as info:
            RedisStateStore(url=f"redis://:{PASSWORD}@127.0.0.1:1/not-a-db")
        assert PASSWORD not in str(info.value)
        with pytest.raises(ValueError, match=r"redis://") as info:
            RedisStateStore(url=f"http://:{PASSWORD}@127.0.0.1:1/0")
        assert PASSWORD not in str(info.value)


def test_url_selects_the_database(server: RedisServer, prefix: str) -> None:
    with RedisStateStore(url=server.url_for(db=3), key_prefix=prefix) as db3:
        db3.put("job", b"in db 3", None)
        with RedisStateStore(url=server.url_for(db=0), key_prefix=prefix) as db0:
            assert db0.get("job") is None
            assert db0.list_jobs() == []
        assert db3.get("job") == Versioned(b"in db 3", 1)
        assert "/3" in db3.server
    with server.client(3) as client:
        assert client.exists(f"{prefix}:job:job") == 1


def test_outage_raises_unavailable_and_the_same_store_recovers() -> None:
    with RedisServer(password=PASSWORD, appendonly=True) as own:
        store = RedisStateStore(url=own.url, password=PASSWORD, **FAST_RETRY)
        token = store.put("job", b"before", None)
        own.stop()
        calls = [
            lambda: store.get("job"),
            lambda: store.put("job", b"during", token),
            lambda: store.delete("job", token),
            lambda: store.list_jobs(),
        ]
        for call in calls:
            with pytest.raises(StateStoreUnavailableError) as info:
                call()
            message = str(info.value)
            assert f"127.0.0.1:{own.port}" in message and "3 attempt(s)" in message
            assert PASSWORD not in message
            assert pickle.loads(pickle.dumps(info.value)).args == info.value.args

        own.start()  # same port; the append-only file brings the data back
        assert store.get("job") == Versioned(b"before", token)
        assert store.put("job", b"after", token) == token + 1
        store.close()


def test_retries_ride_out_a_short_outage() -> None:
    with RedisServer() as own:
        store = RedisStateStore(url=own.url, retries=8, retry_backoff_s=0.05)
        store.put("job", b"v1", None)
        own.stop()
        restarter = threading.Timer(0.3, own.start)
        restarter.start()
        try:
            assert store.put("job", b"v1", None) == 1  # server came back empty (no appendonly)
        finally:
            restarter.join(timeout=20)
        store.close()


def test_a_put_whose_reply_was_lost_is_retried_without_fencing_itself(
    store: RedisStateStore, server: RedisServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    token = store.put("job", b"v1", None)
    real = store._script  # pyright: ignore[reportPrivateUsage]
    calls: list[int] = []

    def lose_first_reply(**kwargs: Any) -> Any:
        reply = real(**kwargs)
        calls.append(1)
        if len(calls) == 1:
            raise redis.ConnectionError("connection reset while reading the reply")
        return reply

    monkeypatch.setattr(store, "_script", lose_first_reply)
    assert store.put("job", b"v2", token) == token + 1
    assert len(calls) == 2
    assert store.get("job") == Versioned(b"v2", token + 1)
    with RedisStateStore(url=server.url, key_prefix=store.key_prefix) as other:
        other.put("job", b"v3", token + 1)
    with pytest.raises(StateConflictError):
        store.put("job", b"stale", token + 1)


def test_racing_prime_masters_exactly_one_wins(server: RedisServer, prefix: str) -> None:
    """Two stores with their own connections, as two PrimeMasters would have, 50 rounds."""
    stores = [RedisStateStore(url=server.url, key_prefix=prefix) for _ in range(2)]
    token = stores[0].put("race", b"start", None)
    for round_ in range(50):
        won, lost = _race(stores, token, [f"m{i}-{round_}".encode() for i in range(len(stores))])
        assert len(won) == 1, f"round {round_}: {won} {lost}"
        assert len(lost) == 1 and isinstance(lost[0], StateConflictError)
        data, token = won[0]
        assert token == round_ + 2
        assert stores[1].get("race") == Versioned(data, token)
    for opened in stores:
        opened.close()


def _race(
    stores: list[RedisStateStore], token: int, payloads: list[bytes]
) -> tuple[list[tuple[bytes, int]], list[BaseException]]:
    """Each store puts its payload with `token`, released together by a barrier."""
    barrier = threading.Barrier(len(stores))
    won: list[tuple[bytes, int]] = []
    lost: list[BaseException] = []

    def write(store: RedisStateStore, data: bytes) -> None:
        try:
            barrier.wait(timeout=10)
            won.append((data, store.put("race", data, token)))
        except BaseException as exc:  # checked by the caller
            lost.append(exc)

    threads = [threading.Thread(target=write, args=pair) for pair in zip(stores, payloads, strict=True)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=20)
    assert not any(thread.is_alive() for thread in threads), "a writer hung"
    return won, lost


def test_key_prefixes_are_isolated(server: RedisServer, prefix: str) -> None:
    names = [prefix, f"{prefix}2", f"{prefix}*[x]?"]
    stores = [RedisStateStore(url=server.url, key_prefix=name) for name in names]
    for n, store in enumerate(stores):
        store.put("job", f"from {n}".encode(), None)
        store.put(f"only-{n}", b"x", None)
    for n, store in enumerate(stores):
        assert store.list_jobs() == ["job", f"only-{n}"]
        assert store.get("job") == Versioned(f"from {n}".encode(), 1)
    stores[0].delete("job")
    assert stores[1].get("job") == Versioned(b"from 1", 1)
    for store in stores:
        store.close()


def test_list_jobs_pages_through_scan(store: RedisStateStore, server: RedisServer, prefix: str) -> None:
    names = [f"job-{n:05d}" for n in range(2500)]
    with server.client() as client, client.pipeline(transaction=False) as pipe:
        for name in names:
            pipe.hset(f"{prefix}:job:{name}", mapping={"token": 1, "data": b""})
        pipe.hset(f"{prefix}:job:Not_A_Job", mapping={"token": 1, "data": b""})
        pipe.execute()
    assert store.list_jobs() == names


def test_found_through_the_entry_point(server: RedisServer, prefix: str) -> None:
    assert "redis" in available_state_stores()
    store = create_state_store("redis", {"url": server.url, "key_prefix": prefix, "retention_s": 60})
    assert isinstance(store, RedisStateStore)
    assert store.put("job", b"v", None) == 1
    store.close()
    with pytest.raises(StateStoreError, match="bad options"):
        create_state_store("redis", {"url": "http://127.0.0.1:6379"})
    with pytest.raises(StateStoreError, match="accepted options: url, username, password"):
        create_state_store("redis", {"host": "127.0.0.1"})


def test_the_script_survives_script_flush(store: RedisStateStore, server: RedisServer) -> None:
    token = store.put("job", b"v1", None)
    with server.client() as client:
        client.script_flush()
    token = store.put("job", b"v2", token)  # EVALSHA answers NOSCRIPT: loaded again
    with server.client() as client:
        client.script_flush()
    store.delete("job", token)
    assert store.get("job") is None


class TestRetention:
    def test_without_retention_nothing_expires(self, store: RedisStateStore, server: RedisServer) -> None:
        token = store.put("job", b"done", None)
        assert store.retain("job", token) is False
        with server.client() as client:
            assert client.pttl(f"{store.key_prefix}:job:job") == -1

    def test_retain_sets_an_expiry_that_a_later_put_removes(
        self, store: RedisStateStore, server: RedisServer
    ) -> None:
        key = f"{store.key_prefix}:job:job"
        token = store.put("job", b"stopped", None)
        assert store.retain("job", token, seconds=30) is True
        with server.client() as client:
            assert 25_000 < client.pttl(key) <= 30_000
            token = store.put("job", b"resumed", token)
            assert client.pttl(key) == -1
        with pytest.raises(StateConflictError, match="retain"):
            store.retain("job", token - 1, seconds=30)
        assert store.retain("missing", seconds=30) is False

    def test_retained_state_goes_away(self, server: RedisServer, prefix: str) -> None:
        with RedisStateStore(url=server.url, key_prefix=prefix, retention_s=0.1) as store:
            token = store.put("job", b"stopped", None)
            assert store.retain("job", token) is True
            deadline = time.monotonic() + 10
            while store.get("job") is not None:
                assert time.monotonic() < deadline, "the retained state never expired"
                time.sleep(0.05)
            assert store.list_jobs() == []


def test_foreign_keys_are_store_errors_not_outages(store: RedisStateStore, server: RedisServer) -> None:
    with server.client() as client:
        client.set(f"{store.key_prefix}:job:job", b"not a hash")
    with pytest.raises(StateStoreError, match="WRONGTYPE") as info:
        store.get("job")
    assert type(info.value) is StateStoreError
    assert info.value.operation == "get of job 'job'"


def test_the_store_pickles_as_its_options(store: RedisStateStore) -> None:
    store.put("job", b"v", None)
    copy = pickle.loads(pickle.dumps(store))
    assert isinstance(copy, RedisStateStore) and copy is not store
    assert copy.get("job") == Versioned(b"v", 1)
    copy.close()


class TestOptions:
    @pytest.mark.parametrize(
        ("options", "match"),
        [
            ({"url": "redis://127.0.0.1:6379/x"}, "database"),
            ({"key_prefix": ""}, "key_prefix"),
            ({"retries": -1}, "retries"),
            ({"retry_backoff_s": "1"}, "retry_backoff_s"),
            ({"connect_timeout_s": 0}, "connect_timeout_s"),
            ({"retention_s": 0}, "retention_s"),
            ({"ssl_ca_certs": "/ca.pem"}, "rediss://"),
            ({"url": "rediss://h:6380/0", "ssl_cert_reqs": "maybe"}, "ssl_cert_reqs"),
        ],
    )
    def test_bad_options_are_value_errors(self, options: dict[str, Any], match: str) -> None:
        with pytest.raises(ValueError, match=match):
            RedisStateStore(**options)

    def test_tls_options_reach_redis_py(self) -> None:
        store = RedisStateStore(
            url="rediss://alice@redis.example:6380/2",
            password="pw",
            ssl_ca_certs="/etc/ca.pem",
            ssl_certfile="/etc/client.pem",
            ssl_keyfile="/etc/client.key",
            ssl_cert_reqs="none",
        )
        pool = store._client.connection_pool  # pyright: ignore[reportPrivateUsage]
        assert pool.connection_class is redis.SSLConnection
        kwargs = pool.connection_kwargs
        assert (kwargs["host"], kwargs["port"], kwargs["db"]) == ("redis.example", 6380, 2)
        assert (kwargs["username"], kwargs["password"]) == ("alice", "pw")
        assert kwargs["ssl_ca_certs"] == "/etc/ca.pem" and kwargs["ssl_cert_reqs"] == "none"
        assert kwargs["ssl_certfile"] == "/etc/client.pem" and kwargs["ssl_keyfile"] == "/etc/client.key"
        assert store.server == "Redis at rediss://redis.example:6380/2"


def test_test_servers_are_stopped_by_pid() -> None:
    own = RedisServer()
    with own:
        pid = own.pid
        assert pid is not None and own.running
        own.restart()
        assert own.pid != pid and own.running
        pid = own.pid
    assert not own.running and own.pid is None
    assert pid is not None
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
