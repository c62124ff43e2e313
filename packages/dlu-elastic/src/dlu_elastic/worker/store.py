"""The process group's TCPStore, hosted by the master rank's agent before training starts.

Without it rank 0's training process creates the store inside `init_process_group`, and a rank
that connects before it listens is refused and retries after torch's back-off: measured here,
four ranks whose rank 0 came up 0.15 s late were all ready after 0.79 s instead of 0.10 s,
and a restart (ranks forked in any order) paid that every time. As torchrun's agent does, the
agent whose address became MASTER_ADDR:MASTER_PORT hosts the round's store and the training
processes get `TORCHELASTIC_USE_AGENT_STORE=True`, so that every rank is a client.

Every agent offers the rendezvous a port it already listens on (`listen`), so that nobody else
can take it. The winner forks the store with that socket (`ProcessSpec.pass_fds`) and starts
its rank at the same time: the kernel queues the ranks' connections until the store serves
them, so no rank waits for the store to start and none is refused. The other agents close
their sockets; no store is forked only to be ended.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
import socket
import time

from dlu_elastic.worker.process_types import PASSED_FDS_ENV
from dlu_prime.runtime import heartbeat

HOST_ENV = "DLU_STORE_HOST"
PORT_ENV = "DLU_STORE_PORT"
TIMEOUT_ENV = "DLU_STORE_TIMEOUT_S"
ENTRYPOINT = "dlu_elastic.worker.store:serve"
AGENT_STORE_ENV = "TORCHELASTIC_USE_AGENT_STORE"
# Connections the kernel queues before the store serves: every rank of a large round may
# connect at once (the kernel caps it at net.core.somaxconn).
_BACKLOG = 4096


def listen(host: str) -> socket.socket:
    """A socket listening on a free port of `host` (an address or a name), for a store to take.

    Raises:
        OSError: `host` is no address of this machine.
    """
    family = socket.AF_INET
    try:
        if ipaddress.ip_address(host).version == 6:
            family = socket.AF_INET6
    except ValueError:
        pass  # a name: IPv4, as the rendezvous offers it
    listener = socket.socket(family, socket.SOCK_STREAM)
    try:
        listener.bind((host, 0))
        listener.listen(_BACKLOG)
    except OSError:
        listener.close()
        raise
    return listener


def serve() -> None:
    """Host a TCPStore at DLU_STORE_HOST:DLU_STORE_PORT until terminated, on the listening socket
    it was passed (PASSED_FDS_ENV) if any; a heartbeat says it serves."""
    import torch.distributed as dist

    host, port = os.environ[HOST_ENV], int(os.environ[PORT_ENV])
    passed = os.environ.get(PASSED_FDS_ENV)
    listen_fd = int(passed.split(",")[0]) if passed else _loopback_listener(host, port)
    _store = dist.TCPStore(  # pyright: ignore[reportPrivateImportUsage]
        host,
        port,
        is_master=True,
        wait_for_workers=False,
        timeout=datetime.timedelta(seconds=float(os.environ.get(TIMEOUT_ENV, "300"))),
        master_listen_fd=listen_fd,
    )
    heartbeat(0)
    while True:  # the store serves from its own thread while this frame holds it
        time.sleep(3600)


def _loopback_listener(host: str, port: int) -> int | None:
    """For a loopback `host` (a local job), a socket listening there for the store to take: torch
    itself listens on every interface (`::`), whatever host it is given, and a local job must not
    be reachable from the network. None (torch's own socket) for any other host."""
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return None
    if not address.is_loopback:
        return None
    listener = socket.socket(socket.AF_INET6 if address.version == 6 else socket.AF_INET, socket.SOCK_STREAM)
    try:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind((host, port))
        listener.listen(128)
    except OSError:
        listener.close()
        raise
    return listener.detach()
