"""The zygote client against a zygote that dies with a request in its listen backlog.

CI saw `stop_all` raise ConnectionResetError: the killed zygote's socket still accepted the
connect (its listener was alive for a moment), then the kernel reset the waiting connection.
"""

from __future__ import annotations

import select
import socket
import threading
from pathlib import Path

import pytest

from dlu_prime import zygote


def _listener(path: Path) -> socket.socket:
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(path))
    listener.listen(8)
    return listener


def _close_once_a_connection_waits(listener: socket.socket) -> threading.Thread:
    """Closes the listener (as a killed zygote's last holder would) once a connect is queued."""

    def run() -> None:
        readable, _, _ = select.select([listener], [], [], 20.0)
        assert readable, "no client connected"
        listener.close()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


@pytest.mark.timeout(30)
def test_a_connection_reset_in_the_backlog_is_a_zygote_error(tmp_path: Path) -> None:
    path = tmp_path / "z-test.sock"
    closer = _close_once_a_connection_waits(_listener(path))
    with pytest.raises(zygote.ZygoteError, match="dropped the connection"):
        zygote.request(path, {"op": "ping"}, 10.0)
    closer.join(5)


@pytest.mark.timeout(30)
def test_stop_all_skips_a_zygote_that_resets_the_ping(tmp_path: Path) -> None:
    closer = _close_once_a_connection_waits(_listener(tmp_path / "z-dead.sock"))
    assert zygote.stop_all(tmp_path, timeout_s=10.0) == []
    closer.join(5)
