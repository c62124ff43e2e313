"""Client selection: no address means the local embedded Ray, an http(s) address a Ray cluster."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from dlu_api.client.base import JobClient, StatusCallback
from dlu_api.client.local import (
    QUIET_RAY_OPTIONS,
    check_local,
    local_client,
    local_records,
    reserve_local,
    warm_up_local,
)

if TYPE_CHECKING:
    from dlu_api.client.remote import RemoteJobClient
    from dlu_api.spec.models import JobSpec

ADDRESS_ENV = "DLU_ADDRESS"


def connect(
    address: str | None = None, workdir: str | None = None, spec: JobSpec | None = None, quiet: bool = False
) -> JobClient:
    """The client for `address`, else `$DLU_ADDRESS`, else the local embedded Ray.

    `workdir` (clusters only): the job's code: a directory here (uploaded), `cluster:/path` on the
    nodes, or a URI; a local run imports from the current directory.
    `spec`: the job about to be submitted; a local run checks what it can without Ray (refusing
    bad input before anything starts), takes the job's name on this machine (refused if another
    process runs it), then starts what this machine's workers will need (the zygote of elastic
    roles) before it imports Ray, so that their imports overlap.
    `quiet` (local runs): the embedded Ray forwards no worker output and logs only errors, so
    `dlu run` shows the job's progress and nothing else (its `--verbose` turns this off).

    Raises:
        ValueError: the address is not an http(s) URL.
        SpecError: a local run of a job that cannot run here; nothing was started.
        MissingComponentError: a local run without dlu-prime installed.
        JobNameTakenError: a local run of a name another process runs (`spec` given).
    """
    address = address or os.environ.get(ADDRESS_ENV) or None
    if address is None or address == "local":
        if spec is not None:
            check_local(spec)
            reserve_local(spec)
            warm_up_local(spec)
        return local_client(QUIET_RAY_OPTIONS if quiet else None)
    if not address.startswith(("http://", "https://")):
        raise ValueError(f"address {address!r} is not the Ray job server's URL; use e.g. http://HEAD:8265")
    from dlu_api.client.remote import RemoteJobClient

    return RemoteJobClient(address, workdir=workdir)


def connect_existing(address: str | None = None) -> JobClient:
    """The client for commands on a job that exists (status, stop, logs, ...): on a cluster as
    `connect`; locally the jobs' files, read without importing Ray (it costs seconds).

    Raises:
        ValueError: the address is not an http(s) URL.
        MissingComponentError: a local job without dlu-prime installed.
    """
    address = address or os.environ.get(ADDRESS_ENV) or None
    if address is None or address == "local":
        return local_records()
    return connect(address)


def __getattr__(name: str) -> Any:
    """`RemoteJobClient` on first use: httpx (with the rich and click it imports) costs 0.2 to
    0.4 s, paid otherwise by every `dlu run` and every Ray worker that imports dlu_api."""
    if name == "RemoteJobClient":
        from dlu_api.client.remote import RemoteJobClient

        return RemoteJobClient
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "ADDRESS_ENV",
    "JobClient",
    "RemoteJobClient",
    "StatusCallback",
    "connect",
    "connect_existing",
    "local_client",
    "local_records",
]
