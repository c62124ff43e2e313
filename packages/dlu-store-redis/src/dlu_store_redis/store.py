"""Job state in Redis (or Valkey): a job outlives its Ray cluster, so `dlu resume` on a new
cluster finds the counters, limits and timeline where the last PrimeMaster left them.

Layout: one hash per job, `{key_prefix}:job:{job}`, with the fields

- `token`: the fencing token, an integer that only `HINCRBY` writes (1 for the first put);
- `data`: the document;
- `writer`: a random id of the put that wrote this version (see "Retries" below).

Every conditional write (put, delete with a token, retain) is one call of one Lua script, so
the compare and the set are a single atomic step on the server: of two PrimeMasters holding
the same token exactly one wins. Reads are one `HMGET`; `list_jobs` uses `SCAN`, never `KEYS`.

Retries: connection errors and timeouts are retried with exponential backoff, then raised as
`StateStoreUnavailableError`. A put whose reply was lost may have landed; its retry would see
its own new token and report a conflict, fencing a PrimeMaster that in fact won. The script
therefore recognises its own earlier write by the `writer` id and reports success.

Run the server with persistence (AOF, or RDB snapshots): one that restarts empty looks like a
deleted job, so the PrimeMaster's next put is refused and it stops as fenced.

Retention: a finished job's state is kept forever unless the caller asks for an expiry with
`retain(job, token)`, using the `retention_s` option (or an explicit `seconds`). It is meant
for the PrimeManager to call, when its store has it (`getattr(store, "retain", None)`), right
after saving the STOPPED state; any later put (e.g. `dlu resume`) removes the expiry again, so
live state is never dropped.
"""

from __future__ import annotations

import logging
import math
import os
import time
from collections.abc import Callable
from typing import Any, ClassVar, TypeVar, cast

import redis
from redis.backoff import NoBackoff
from redis.commands.core import Script
from redis.connection import ConnectionPool
from redis.exceptions import (
    AuthenticationError,
    AuthenticationWrongNumberOfArgsError,
    AuthorizationError,
    NoPermissionError,
    ReadOnlyError,
    RedisError,
)
from redis.retry import Retry

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
from dlu_store_redis.options import (
    apply_tls,
    check_int,
    check_prefix,
    check_seconds,
    connection_kwargs,
    describe_server,
)

logger = logging.getLogger(__name__)

_T = TypeVar("_T")

DEFAULT_URL = "redis://127.0.0.1:6379/0"
_MAX_BACKOFF_S = 5.0
_SCAN_COUNT = 1000
_GLOB_SPECIAL = "\\*?[]"

# KEYS[1]: the job's hash. ARGV[1]: "put", "del" or "expire". ARGV[2]: the expected token,
# "" for none (put: the job must not exist; del/expire: unconditional).
# put: ARGV[3] the writer id, ARGV[4] the data. expire: ARGV[3] milliseconds.
# Returns {1, token} on success ("" when the job does not exist), {0, current token} on conflict.
_CAS_SCRIPT = """
local key, op, expected = KEYS[1], ARGV[1], ARGV[2]
local current = redis.call('HGET', key, 'token') or ''
if op == 'put' then
  if current ~= expected then
    if current ~= '' and redis.call('HGET', key, 'writer') == ARGV[3] then
      return {1, current}
    end
    return {0, current}
  end
  redis.call('HSET', key, 'data', ARGV[4], 'writer', ARGV[3])
  local token = redis.call('HINCRBY', key, 'token', 1)
  redis.call('PERSIST', key)
  return {1, token}
end
if current == '' then
  return {1, ''}
end
if expected ~= '' and current ~= expected then
  return {0, current}
end
if op == 'del' then
  redis.call('DEL', key)
  return {1, ''}
end
if op == 'expire' then
  redis.call('PEXPIRE', key, ARGV[3])
  return {1, current}
end
return redis.error_reply('dlu state script: unknown operation ' .. op)
"""


class RedisStateStore(StateStore):
    """Job documents in a Redis or Valkey server, written by compare-and-set.

    Options are the job spec's `state_store.options`. Nothing connects until the first call,
    so constructing one checks the options only; the store pickles as its options, so it can
    be shipped to a Ray actor.
    """

    name: ClassVar[str] = "redis"

    def __init__(
        self,
        url: str = DEFAULT_URL,
        *,
        username: str | None = None,
        password: str | None = None,
        key_prefix: str = "dlu",
        connect_timeout_s: float = 5.0,
        operation_timeout_s: float = 5.0,
        retries: int = 3,
        retry_backoff_s: float = 0.1,
        retention_s: float | None = None,
        ssl_ca_certs: str | None = None,
        ssl_certfile: str | None = None,
        ssl_keyfile: str | None = None,
        ssl_cert_reqs: str = "required",
    ) -> None:
        """
        Args:
            url: `redis://[user:password@]host[:port][/db]`, `rediss://` for TLS, or
                `unix:///path/to/socket`.
            username, password: override the URL's (a password need not sit in the spec's URL).
            key_prefix: namespace of every key, so several DLU installations can share a server.
            connect_timeout_s, operation_timeout_s: socket timeouts of one attempt.
            retries, retry_backoff_s: attempts after the first on a connection error or timeout,
                waiting `retry_backoff_s` and doubling (capped at 5 s) between them.
            retention_s: how long `retain` keeps a finished job's state; None keeps it forever.
            ssl_ca_certs, ssl_certfile, ssl_keyfile, ssl_cert_reqs: TLS settings for `rediss://`.

        Raises:
            ValueError: an option is malformed.
        """
        self._options: dict[str, Any] = {k: v for k, v in locals().items() if k not in ("self", "__class__")}
        connection = connection_kwargs(url, username, password)
        self.key_prefix = check_prefix(key_prefix)
        self.retries = check_int(retries, "retries")
        self.retry_backoff_s = check_seconds(retry_backoff_s, "retry_backoff_s", allow_zero=True)
        self.retention_s = (
            None if retention_s is None else check_seconds(retention_s, "retention_s", allow_zero=False)
        )
        apply_tls(
            connection,
            url,
            ca_certs=ssl_ca_certs,
            certfile=ssl_certfile,
            keyfile=ssl_keyfile,
            cert_reqs=ssl_cert_reqs,
        )
        self.server = describe_server(url, connection)
        self._username: str | None = connection.get("username")
        self._password: str | None = connection.get("password")
        pool = ConnectionPool(
            **connection,
            socket_connect_timeout=check_seconds(connect_timeout_s, "connect_timeout_s", allow_zero=False),
            socket_timeout=check_seconds(operation_timeout_s, "operation_timeout_s", allow_zero=False),
            # Retries happen in `_call` alone, where the backoff and the final error are ours.
            retry=Retry(NoBackoff(), 0),
            client_name="dlu-state-store",
        )
        self._client = redis.Redis(connection_pool=pool)
        self._script: Script = self._client.register_script(_CAS_SCRIPT)

    # StateStore ------------------------------------------------------------------------------
    def get(self, job: str) -> Versioned | None:
        validate_job(job)
        reply = self._call(
            f"get of job {job!r}",
            lambda: self._client.execute_command("HMGET", self._key(job), "token", "data"),
        )
        token, data = cast(list[bytes | None], reply)
        if token is None:
            return None
        return Versioned(data or b"", int(token))

    def put(self, job: str, data: bytes, token: int | None) -> int:
        validate_job(job)
        validate_data(data)
        validate_token(token)
        op = f"put of job {job!r}"
        writer = os.urandom(8).hex()
        new = self._cas(op, job, token, "put", writer, data)
        if new is None:  # the script never answers a put with "no job"
            raise StateStoreError(self.name, op, "the server returned no token")
        logger.debug("job %r saved at token %d (%d bytes)", job, new, len(data))
        return new

    def delete(self, job: str, token: int | None = None) -> None:
        validate_job(job)
        validate_token(token)
        op = f"delete of job {job!r}"
        if token is None:
            self._call(op, lambda: self._client.execute_command("DEL", self._key(job)))
        else:
            self._cas(op, job, token, "del")

    def list_jobs(self) -> list[str]:
        prefix = self._key("").encode()
        pattern = _glob_escape(self._key("")) + "*"

        def scan() -> list[bytes]:
            return list(self._client.scan_iter(match=pattern, count=_SCAN_COUNT))

        jobs: set[str] = set()
        for key in self._call("list_jobs", scan):
            try:
                jobs.add(validate_job(key[len(prefix) :].decode()))
            except (UnicodeDecodeError, ValueError):
                logger.debug("ignoring key %r: not a job of prefix %r", key, self.key_prefix)
        return sorted(jobs)

    def close(self) -> None:
        self._client.close()

    # Redis only ------------------------------------------------------------------------------
    def retain(self, job: str, token: int | None = None, seconds: float | None = None) -> bool:
        """Let the state of a finished `job` expire `seconds` (default: `retention_s`) from now.

        With `token`, only if it is still the current version, so a fenced PrimeMaster cannot
        schedule its successor's state for removal. A later put removes the expiry.

        Returns:
            True if an expiry was set; False if there is nothing to do (no retention configured,
            or the job has no state).

        Raises:
            ValueError: `job`, `token` or `seconds` is invalid.
            StateConflictError: `token` is given and a different version is current.
            StateStoreUnavailableError, StateStoreError: as for `put`.
        """
        validate_job(job)
        validate_token(token)
        if seconds is None:
            seconds = self.retention_s
        if seconds is None:
            return False
        millis = max(1, math.ceil(check_seconds(seconds, "seconds", allow_zero=False) * 1000))
        return self._cas(f"retain of job {job!r}", job, token, "expire", str(millis)) is not None

    def __reduce__(self) -> tuple[Callable[..., RedisStateStore], tuple[dict[str, Any]]]:
        return (_restore, (self._options,))

    def __repr__(self) -> str:
        return f"{type(self).__name__}(server={self.server!r}, key_prefix={self.key_prefix!r})"

    # internals -------------------------------------------------------------------------------
    def _key(self, job: str) -> str:
        return f"{self.key_prefix}:job:{job}"

    def _cas(self, op: str, job: str, token: int | None, action: str, *args: str | bytes) -> int | None:
        """Run the script; the job's token afterwards (None: no job), or StateConflictError."""
        expected = "" if token is None else str(token)
        reply = self._call(op, lambda: self._script(keys=[self._key(job)], args=[action, expected, *args]))
        status, current = cast(list[Any], reply)
        current_token = int(current) if current not in (b"", "") else None
        if status != 1:
            raise StateConflictError(self.name, op, describe_conflict(token, current_token))
        return current_token

    def _call(self, op: str, fn: Callable[[], _T]) -> _T:
        """The one place that talks to Redis: retries connection errors with backoff and turns
        every redis-py error into a StateStoreError subclass naming the server, never the
        password."""
        delay = self.retry_backoff_s
        started = time.monotonic()
        for attempt in range(self.retries + 1):
            try:
                return fn()
            except (AuthenticationError, AuthorizationError, AuthenticationWrongNumberOfArgsError) as exc:
                user = self._username or "default"
                raise StateStoreError(
                    self.name,
                    op,
                    f"{self.server} refused the credentials of user {user!r}: {self._redact(exc)}; "
                    "check the username and password options (or the url)",
                ) from exc
            except NoPermissionError as exc:
                raise StateStoreError(
                    self.name, op, f"{self.server}: user lacks a permission: {self._redact(exc)}"
                ) from exc
            except (redis.ConnectionError, redis.TimeoutError, ReadOnlyError, OSError) as exc:
                if attempt == self.retries:
                    raise StateStoreUnavailableError(
                        self.name,
                        op,
                        f"{self.server} is unreachable after {attempt + 1} attempt(s) over "
                        f"{time.monotonic() - started:.1f}s: {type(exc).__name__}: {self._redact(exc)}",
                    ) from exc
                logger.debug("%s: %s failed (%s), retrying in %.2fs", self.server, op, exc, delay)
                time.sleep(delay)
                delay = min(delay * 2, _MAX_BACKOFF_S)
            except RedisError as exc:
                raise StateStoreError(
                    self.name, op, f"{self.server} answered {type(exc).__name__}: {self._redact(exc)}"
                ) from exc
        raise AssertionError("unreachable")  # pragma: no cover - the loop returns or raises

    def _redact(self, exc: BaseException) -> str:
        text = str(exc)
        return text.replace(self._password, "***") if self._password else text


def _restore(options: dict[str, Any]) -> RedisStateStore:
    return RedisStateStore(**options)


def _glob_escape(text: str) -> str:
    return "".join(f"\\{c}" if c in _GLOB_SPECIAL else c for c in text)
