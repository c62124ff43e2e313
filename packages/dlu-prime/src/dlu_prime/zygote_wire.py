"""The zygote's wire: length-prefixed pickled dicts over an AF_UNIX stream, descriptors attached,
and the settings the zygote and its clients share. Its own module so that the zygote process
(`dlu_prime.zygote_server`) and its clients (`dlu_prime.zygote`) both import it and not each
other."""

from __future__ import annotations

import pickle
import socket
import struct
from collections.abc import Sequence
from typing import Any

DEFAULT_IDLE_S = 300.0
_HEADER = struct.Struct("!I")
_MAX_FDS = 8
MAX_SPARES = 16  # children forked ahead, at most (one per rank a node starts at once)
# Children are forked ahead only once no fork was asked for this long: a fork of a process with
# torch loaded took 15 to 300 ms here, and refilling right after a restart's burst made the
# zygote hand out the burst's later processes, and report its exits, that much late, besides
# taking CPU from the new processes' start (traced: 0.3 s of an in-place restart under load).
REFILL_QUIET_ENV = "DLU_ZYGOTE_REFILL_QUIET_S"
DEFAULT_REFILL_QUIET_S = 1.0
_MAX_MESSAGE = 64 << 20


class ZygoteError(RuntimeError):
    """The zygote could not be reached or refused a request."""


def send_message(sock: socket.socket, message: dict[str, Any], fds: Sequence[int] = ()) -> None:
    data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    framed = _HEADER.pack(len(data)) + data
    sent = socket.send_fds(sock, [framed], list(fds)) if fds else sock.send(framed)
    if sent < len(framed):
        sock.sendall(framed[sent:])


def recv_message(sock: socket.socket) -> tuple[dict[str, Any] | None, list[int]]:
    """One message and the descriptors that came with it; (None, []) on a closed connection."""
    head, fds, _flags, _addr = socket.recv_fds(sock, _HEADER.size, _MAX_FDS)
    if not head:
        return None, fds
    while len(head) < _HEADER.size:
        more = sock.recv(_HEADER.size - len(head))
        if not more:
            return None, fds
        head += more
    (size,) = _HEADER.unpack(head)
    if size > _MAX_MESSAGE:
        raise ZygoteError(f"message of {size} bytes is larger than {_MAX_MESSAGE}")
    body = bytearray()
    while len(body) < size:
        chunk = sock.recv(min(size - len(body), 1 << 20))
        if not chunk:
            return None, fds
        body += chunk
    return pickle.loads(bytes(body)), fds
