"""The process group's TCPStore, hosted by the master rank's agent before training starts.

Without it rank 0's training process creates the store inside `init_process_group`, and a rank
that connects before it listens is refused and retries after torch's back-off: measured here,
four ranks whose rank 0 came up 0.15 s late were all ready after 0.79 s instead of 0.10 s,
and a restart (ranks forked in any order) paid that every time. As torchrun's agent does,
every agent forks a store (from the zygote, milliseconds) at the port it offers the rendezvous;
the one whose port became MASTER_PORT keeps it for the round, the others end theirs, and the
training processes get `TORCHELASTIC_USE_AGENT_STORE=True` so that every rank is a client.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
import socket
import time

from dlu_prime.runtime import heartbeat

HOST_ENV = "DLU_STORE_HOST"
PORT_ENV = "DLU_STORE_PORT"
TIMEOUT_ENV = "DLU_STORE_TIMEOUT_S"
ENTRYPOINT = "dlu_elastic.worker.store:serve"
AGENT_STORE_ENV = "TORCHELASTIC_USE_AGENT_STORE"


def serve() -> None:
    """Host a TCPStore at DLU_STORE_HOST:DLU_STORE_PORT until terminated; a heartbeat says it
    listens."""
    import torch.distributed as dist

    host, port = os.environ[HOST_ENV], int(os.environ[PORT_ENV])
    _store = dist.TCPStore(  # pyright: ignore[reportPrivateImportUsage]
        host,
        port,
        is_master=True,
        wait_for_workers=False,
        timeout=datetime.timedelta(seconds=float(os.environ.get(TIMEOUT_ENV, "300"))),
        master_listen_fd=_loopback_listener(host, port),
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
