"""Client selection: no address means the local embedded Ray, an http(s) address a Ray cluster."""

from __future__ import annotations

import os

from dlu_api.client.base import JobClient, StatusCallback
from dlu_api.client.local import local_client
from dlu_api.client.remote import RemoteJobClient

ADDRESS_ENV = "DLU_ADDRESS"


def connect(address: str | None = None, workdir: str | None = None) -> JobClient:
    """The client for `address`, else `$DLU_ADDRESS`, else the local embedded Ray.

    `workdir` (clusters only): the directory on the cluster's nodes that holds the job's code;
    a local run imports from the current directory.

    Raises:
        ValueError: the address is not an http(s) URL.
        MissingComponentError: a local run without dlu-prime installed.
    """
    address = address or os.environ.get(ADDRESS_ENV) or None
    if address is None or address == "local":
        return local_client()
    if not address.startswith(("http://", "https://")):
        raise ValueError(f"address {address!r} is not the Ray job server's URL; use e.g. http://HEAD:8265")
    return RemoteJobClient(address, workdir=workdir)


__all__ = ["ADDRESS_ENV", "JobClient", "RemoteJobClient", "StatusCallback", "connect", "local_client"]
