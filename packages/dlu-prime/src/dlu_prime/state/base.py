"""The `StateStore` contract: one versioned document per job, written by compare-and-set.

The token returned with each document is a fencing token: a PrimeMaster that lost
leadership still holds an old token, so its next `put` fails instead of overwriting the
state its successor wrote.
"""

from __future__ import annotations

import inspect
import logging
import re
from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass
from importlib.metadata import EntryPoint, entry_points
from types import TracebackType
from typing import Any, ClassVar, Self

logger = logging.getLogger(__name__)

ENTRY_POINT_GROUP = "dlu.state_stores"

_JOB_RE = re.compile(r"[a-z0-9-]+")

# Where a store that is not installed can be found, for the error message.
_KNOWN_PACKAGES = {"redis": "dlu-store-redis"}


class StateStoreError(Exception):
    """Base of every state-store failure; the message names the store and the operation."""

    def __init__(self, store: str, operation: str, detail: str) -> None:
        super().__init__(f"state store {store!r}: {operation} failed: {detail}")
        self.store = store
        self.operation = operation
        self.detail = detail

    def __reduce__(self) -> tuple[type[Self], tuple[str, str, str]]:
        # Keep the three fields when the error crosses a Ray process boundary (pickle).
        return (type(self), (self.store, self.operation, self.detail))


class StateConflictError(StateStoreError):
    """Compare-and-set lost: someone wrote a newer version, so the caller is fenced."""


class StateStoreUnavailableError(StateStoreError):
    """The backend cannot be reached; the outcome of an interrupted write is unknown."""


@dataclass(frozen=True)
class Versioned:
    """A stored document and its fencing token (1 for the first write, +1 per write)."""

    data: bytes
    token: int


def validate_job(job: object, argument: str = "job") -> str:
    """Return `job` if it is a valid job name, else raise ValueError naming `argument`.

    The character set keeps job names safe inside key paths (no separators), so one job's
    keys can never be read as another's.
    """
    if not isinstance(job, str) or not _JOB_RE.fullmatch(job):
        raise ValueError(
            f"{argument} must be a non-empty string of lowercase letters, digits and '-', got {job!r}"
        )
    return job


def validate_token(token: object, argument: str = "token") -> int | None:
    """Return `token` if it is None or a positive int, else raise ValueError naming `argument`."""
    if token is None:
        return None
    if isinstance(token, bool) or not isinstance(token, int) or token < 1:
        raise ValueError(f"{argument} must be None or a positive int (a fencing token), got {token!r}")
    return token


def validate_data(data: object, argument: str = "data") -> bytes:
    """Return `data` if it is bytes, else raise TypeError naming `argument`."""
    if not isinstance(data, bytes):
        raise TypeError(f"{argument} must be bytes, got {type(data).__name__}")
    return data


def describe_conflict(expected: int | None, current: int | None) -> str:
    """Explain a lost compare-and-set, in the same words for every store."""
    if expected is None:
        return f"the job already exists at token {current} (expected it not to exist)"
    if current is None:
        return f"the job has no state (expected token {expected}): it was deleted or never written"
    return (
        f"expected token {expected} but the current token is {current}: "
        "another writer got there first, so this one is fenced"
    )


@dataclass(frozen=True)
class Settled:
    """Which way a put whose outcome was unknown went (see `settle`)."""

    landed: bool
    """The write is the current version: `token` is its token, the writer's to carry on with."""
    token: int | None
    """The job's current token, which the writer's next put expects."""


def settle(store: StateStore, job: str, token: int | None, *written: bytes) -> Settled:
    """Read back puts `put(job, data, token)` (one per `written` data) that raised
    `StateStoreUnavailableError`; at most one of them can have landed, all expecting `token`.

    A write may have landed, or may still land (a hung server executes it when it resumes).
    The document itself identifies the write: the version after `token` holding exactly the
    data written is this writer's. Nothing newer, and the writer's next put (expecting `token`)
    is safe: if a late write lands first, `settle` again finds it; if after, its
    compare-and-set fails.

    Raises:
        StateConflictError: another writer wrote since `token` (the caller is fenced).
        StateStoreUnavailableError: still unreachable; the outcome stays unknown.
    """
    found = store.get(job)
    current = found.token if found is not None else None
    if found is not None and found.token == (1 if token is None else token + 1) and found.data in written:
        return Settled(True, found.token)
    if current == token:
        return Settled(False, token)
    raise StateConflictError(store.name, f"settle of job {job!r}", describe_conflict(token, current))


class StateStore(ABC):
    """Versioned per-job documents with compare-and-set writes.

    Implementations validate arguments with `validate_job`, `validate_token` and
    `validate_data`, and raise only `StateStoreError` subclasses for backend failures.
    """

    name: ClassVar[str] = "unnamed"
    """The entry-point name of the store, used in error messages."""

    @abstractmethod
    def get(self, job: str) -> Versioned | None:
        """Return the newest document of `job` and its token, or None if it has none.

        Raises:
            ValueError: `job` is not a valid job name.
            StateStoreUnavailableError: the backend cannot be reached.
            StateStoreError: any other backend failure.
        """

    @abstractmethod
    def put(self, job: str, data: bytes, token: int | None) -> int:
        """Write `data` if the current token of `job` equals `token`; return the new token.

        `token=None` means the job must not exist yet (its first write returns 1). Two
        writers racing with the same token: exactly one wins.

        Raises:
            ValueError: `job` or `token` is invalid.
            TypeError: `data` is not bytes.
            StateConflictError: the current token differs from `token` (the caller is fenced).
            StateStoreUnavailableError: the backend cannot be reached; the write may or may
                not have happened (or happen later), so `settle` it before the next write.
            StateStoreError: any other backend failure.
        """

    @abstractmethod
    def delete(self, job: str, token: int | None = None) -> None:
        """Delete every version of `job`; with `token`, only if it is still the current one.

        Deleting a job that does not exist is a no-op, with or without a token, so a retried
        delete succeeds.

        Raises:
            ValueError: `job` or `token` is invalid.
            StateConflictError: `token` is given and a different version is current.
            StateStoreUnavailableError: the backend cannot be reached.
            StateStoreError: any other backend failure.
        """

    @abstractmethod
    def list_jobs(self) -> list[str]:
        """Return the names of all jobs that have a document, sorted.

        Raises:
            StateStoreUnavailableError: the backend cannot be reached.
            StateStoreError: any other backend failure.
        """

    def close(self) -> None:  # noqa: B027 - optional hook, a no-op by default
        """Release connections; the store must not be used afterwards."""

    def retain(self, job: str, token: int | None = None, seconds: float | None = None) -> bool:
        """Let a finished job's state expire after its retention period, where the store supports
        it (e.g. Redis' `retention_s`). Returns whether an expiry was set; by default none is."""
        del job, token, seconds
        return False

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def available_state_stores() -> list[str]:
    """Names registered under the `dlu.state_stores` entry-point group, sorted."""
    return sorted({ep.name for ep in entry_points(group=ENTRY_POINT_GROUP)})


def create_state_store(name: str, options: Mapping[str, Any] | None = None) -> StateStore:
    """Build the store registered as `name` with `**options`.

    Looked up on every call (nothing cached), so a store installed at runtime is found.

    Raises:
        StateStoreError: no store has that name, it cannot be loaded, or `options` do not
            fit its constructor.
    """
    kwargs = dict(options or {})
    cls = _load_store_class(name)
    try:
        inspect.signature(cls).bind(**kwargs)
    except TypeError as exc:
        raise StateStoreError(
            name, "create", f"bad options {sorted(kwargs)}: {exc}; {_accepted_options(cls)}"
        ) from exc
    try:
        return cls(**kwargs)
    except (TypeError, ValueError) as exc:
        raise StateStoreError(name, "create", f"bad options {sorted(kwargs)}: {exc}") from exc


def _load_store_class(name: str) -> type[StateStore]:
    found = entry_points(group=ENTRY_POINT_GROUP).select(name=name)
    # The same entry point can show up twice (e.g. two dist-infos for one editable install).
    targets: dict[str, EntryPoint] = {ep.value: ep for ep in found}
    if not targets:
        available = ", ".join(repr(n) for n in available_state_stores()) or "none"
        package = _KNOWN_PACKAGES.get(name)
        hint = (
            f"install {package}"
            if package
            else "install the package that provides it (e.g. dlu-store-redis for 'redis')"
        )
        raise StateStoreError(
            name,
            "create",
            f"no state store named {name!r} is installed (available: {available}); stores "
            f"register under the entry-point group {ENTRY_POINT_GROUP!r}, so {hint}",
        )
    if len(targets) > 1:
        raise StateStoreError(
            name, "create", f"several packages register {name!r}: {sorted(targets)}; uninstall all but one"
        )
    entry = next(iter(targets.values()))
    try:
        loaded: object = entry.load()
    except Exception as exc:
        raise StateStoreError(name, "create", f"cannot import {entry.value}: {exc}") from exc
    if not (isinstance(loaded, type) and issubclass(loaded, StateStore)):
        raise StateStoreError(name, "create", f"{entry.value} is not a StateStore subclass")
    logger.debug("state store %r is %s", name, entry.value)
    return loaded


def _accepted_options(cls: type[StateStore]) -> str:
    params = [
        p.name
        for p in inspect.signature(cls).parameters.values()
        if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
    ]
    return f"accepted options: {', '.join(params)}" if params else "it accepts no options"
