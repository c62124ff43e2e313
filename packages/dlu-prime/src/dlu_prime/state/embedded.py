"""Default state store, kept in Ray's own control store (the GCS internal KV).

It needs no server and outlives any PrimeMaster (it lives as long as the Ray cluster, or
longer with GCS fault tolerance backed by Redis).

The GCS KV offers get, put, put-if-absent, delete and prefix listing, but no
compare-and-set. CAS is built from put-if-absent on a key per version: version `t` of a job
is stored under `state/<job>/<t, 12 digits>`, and `put(job, data, t)`:

1. lists the job's versions and checks that `t` is the newest (None: that there are none);
2. creates key `t + 1` only if absent; the GCS applies those one at a time, so of two
   writers holding the same token exactly one creates it and the other is fenced;
3. lists again: a version newer than `t + 1`, or `t` missing (the job was deleted), means
   the write raced with a newer writer or a delete, so it is rolled back and refused.
   Without this check a writer with an old token could recreate a version key that was
   already garbage-collected;
4. deletes the versions older than `t + 1`, keeping only the newest.

A version key is only ever deleted once a newer one exists (or by `delete`), so the newest
key never goes backwards and step 3 sees every write that beat this one.
Left-overs of a crashed writer are older versions, removed by the next successful put.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TypeVar

from dlu_prime import ray_private
from dlu_prime.state.base import (
    StateConflictError,
    StateStore,
    StateStoreError,
    StateStoreUnavailableError,
    Versioned,
    describe_conflict,
    validate_data,
    validate_job,
    validate_token,
)

logger = logging.getLogger(__name__)

_T = TypeVar("_T")

_ROOT = "state/"
_DIGITS = 12
_MAX_TOKEN = 10**_DIGITS - 1
# A read retries when the newest version vanishes between listing and reading it.
_READ_ATTEMPTS = 50


class EmbeddedStateStore(StateStore):
    """Job documents in the GCS internal KV of the Ray cluster this process is connected to.

    Ray must be initialized (`ray.init()`, or any code inside a Ray task or actor) when the
    store is used; constructing it needs nothing, so it can be shipped to an actor.
    """

    name = "embedded"

    def __init__(self, namespace: str = "dlu") -> None:
        if not isinstance(namespace, str) or not namespace:  # pyright: ignore[reportUnnecessaryIsInstance]
            raise ValueError(f"namespace must be a non-empty string, got {namespace!r}")
        self.namespace = namespace
        self._kv = _GcsKv(self.name, namespace)

    def get(self, job: str) -> Versioned | None:
        validate_job(job)
        op = f"get of job {job!r}"
        for _ in range(_READ_ATTEMPTS):
            tokens = self._tokens(op, job)
            if not tokens:
                return None
            data = self._kv.get(op, _key(job, tokens[-1]))
            if data is not None:
                return Versioned(data, tokens[-1])
            # Superseded (a newer put deletes it) or deleted since the listing: look again.
        raise StateStoreError(self.name, op, f"the job changed under each of {_READ_ATTEMPTS} reads")

    def put(self, job: str, data: bytes, token: int | None) -> int:
        validate_job(job)
        validate_data(data)
        validate_token(token)
        op = f"put of job {job!r}"
        new = 1 if token is None else token + 1
        if new > _MAX_TOKEN:
            raise StateStoreError(self.name, op, f"token {token} is the largest this store can hold")

        current = _newest(self._tokens(op, job))
        if current != token:
            raise StateConflictError(self.name, op, describe_conflict(token, current))
        if self._kv.put_if_absent(op, _key(job, new), data):
            raise StateConflictError(
                self.name, op, f"a concurrent writer took token {new} first: this writer is fenced"
            )

        after = self._tokens(op, job)
        newer = _newest([t for t in after if t > new])
        if newer is not None or (token is not None and token not in after):
            self._kv.delete(op, _key(job, new))
            reason = (
                f"token {newer} was written concurrently: this writer is fenced"
                if newer is not None
                else "the job was deleted concurrently"
            )
            raise StateConflictError(self.name, op, reason)

        for old in after:
            if old < new:
                self._kv.delete(op, _key(job, old))
        logger.debug("job %r saved at token %d (%d bytes)", job, new, len(data))
        return new

    def delete(self, job: str, token: int | None = None) -> None:
        validate_job(job)
        validate_token(token)
        op = f"delete of job {job!r}"
        if token is None:
            self._kv.delete_prefix(op, _prefix(job))
            return
        tokens = self._tokens(op, job)
        if not tokens:
            return
        if tokens[-1] != token:
            raise StateConflictError(self.name, op, describe_conflict(token, tokens[-1]))
        for old in tokens:
            self._kv.delete(op, _key(job, old))
        # A put that passed its own check before our deletes can still land: it wins.
        newer = _newest(self._tokens(op, job))
        if newer is not None:
            raise StateConflictError(
                self.name, op, f"token {newer} was written while deleting: the job still exists"
            )

    def list_jobs(self) -> list[str]:
        jobs: set[str] = set()
        for key in self._kv.keys("list_jobs", _ROOT):
            parsed = _parse_key(key)
            if parsed is not None:
                jobs.add(parsed[0])
        return sorted(jobs)

    def _tokens(self, op: str, job: str) -> list[int]:
        """The job's stored versions, oldest first."""
        tokens: list[int] = []
        for key in self._kv.keys(op, _prefix(job)):
            parsed = _parse_key(key)
            if parsed is not None and parsed[0] == job:
                tokens.append(parsed[1])
        return sorted(tokens)


def _prefix(job: str) -> str:
    # The trailing "/" keeps job "a" from listing the keys of job "ab".
    return f"{_ROOT}{job}/"


def _key(job: str, token: int) -> str:
    return f"{_prefix(job)}{token:0{_DIGITS}d}"


def _newest(tokens: list[int]) -> int | None:
    return max(tokens) if tokens else None


def _parse_key(key: bytes) -> tuple[str, int] | None:
    """Split `state/<job>/<token>` into job and token; None (with a warning) for anything else."""
    parts = key.decode("utf-8", "replace").split("/")
    if len(parts) == 3 and parts[0] + "/" == _ROOT and len(parts[2]) == _DIGITS and parts[2].isdigit():
        try:
            return validate_job(parts[1]), int(parts[2])
        except ValueError:
            pass
    logger.warning("ignoring unexpected key %r in the embedded state store", key)
    return None


class _GcsKv:
    """The GCS key-value store (Ray's private internal_kv, through dlu_prime.ray_private); it
    turns Ray's errors into StateStoreError subclasses.

    Ray is imported on first use, so importing the state package stays cheap.
    """

    def __init__(self, store: str, namespace: str) -> None:
        self._store = store
        self._namespace = namespace

    def get(self, op: str, key: str) -> bytes | None:
        return self._call(op, lambda: ray_private.kv_get(key, self._namespace))

    def put_if_absent(self, op: str, key: str, value: bytes) -> bool:
        """Create `key` unless it exists; True means it already existed (nothing written)."""
        return self._call(op, lambda: ray_private.kv_put_if_absent(key, value, self._namespace))

    def delete(self, op: str, key: str) -> None:
        self._call(op, lambda: ray_private.kv_delete(key, self._namespace))

    def delete_prefix(self, op: str, prefix: str) -> None:
        self._call(op, lambda: ray_private.kv_delete(prefix, self._namespace, by_prefix=True))

    def keys(self, op: str, prefix: str) -> list[bytes]:
        return self._call(op, lambda: ray_private.kv_keys(prefix, self._namespace))

    def _call(self, op: str, fn: Callable[[], _T]) -> _T:
        import ray
        from ray.exceptions import GetTimeoutError, RpcError

        if not ray.is_initialized():
            raise StateStoreUnavailableError(
                self._store,
                op,
                "Ray is not initialized: this store lives in the Ray cluster's control store (GCS), "
                "so call ray.init() first or use it from inside a Ray task or actor",
            )
        try:
            return fn()
        except (RpcError, GetTimeoutError, ConnectionError) as exc:
            raise StateStoreUnavailableError(
                self._store, op, f"Ray's control store (GCS) is unreachable: {exc}"
            ) from exc
        except AttributeError as exc:
            # Ray was shut down between the check above and the call: its KV client is None.
            raise StateStoreUnavailableError(
                self._store, op, f"Ray was shut down during the call: {exc}"
            ) from exc
        except Exception as exc:
            raise StateStoreError(
                self._store, op, f"Ray's internal KV failed: {type(exc).__name__}: {exc}"
            ) from exc
