"""The TCP sockets a set of processes listens on, read from /proc (no psutil in the venv)."""

from __future__ import annotations

import ipaddress
import os
from dataclasses import dataclass
from pathlib import Path

_LISTEN = "0A"  # TCP_LISTEN in /proc/net/tcp's `st` column


@dataclass(frozen=True)
class Listener:
    pid: int
    name: str
    host: str
    port: int

    @property
    def loopback(self) -> bool:
        """127.0.0.0/8, ::1, or 127.x mapped into IPv6 (a dual-stack socket bound to 127.0.0.1)."""
        address = ipaddress.ip_address(self.host)
        if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
            address = address.ipv4_mapped
        return address.is_loopback


def _decode(hex_addr: str) -> tuple[str, int]:
    """/proc/net/tcp{,6} writes `ADDR:PORT` in hex, the address in host (little-endian) words."""
    addr, port = hex_addr.split(":")
    raw = bytes.fromhex(addr)
    words = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
    return str(ipaddress.ip_address(words)), int(port, 16)


def _listening_inodes(pid: int) -> dict[int, tuple[str, int]]:
    """inode -> (host, port) of every listening TCP socket in `pid`'s network namespace."""
    found: dict[int, tuple[str, int]] = {}
    for table in ("tcp", "tcp6"):
        try:
            lines = Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if fields[3] == _LISTEN:
                found[int(fields[9])] = _decode(fields[1])
    return found


def _socket_inodes(pid: int) -> set[int]:
    inodes: set[int] = set()
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return inodes
    for fd in fds:
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(int(target[8:-1]))
    return inodes


def listeners(pids: set[int]) -> list[Listener]:
    """Every TCP socket in LISTEN state that one of `pids` holds open."""
    result: list[Listener] = []
    for pid in sorted(pids):
        table = _listening_inodes(pid)
        try:
            name = Path(f"/proc/{pid}/comm").read_text().strip()
        except OSError:
            continue
        for inode in _socket_inodes(pid):
            if inode in table:
                host, port = table[inode]
                result.append(Listener(pid, name, host, port))
    return result
