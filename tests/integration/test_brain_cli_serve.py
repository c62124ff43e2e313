"""`dlu brain serve` as a process: it announces its URL, `dlu brain status` reads it, SIGTERM ends it."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = [pytest.mark.timeout(120), pytest.mark.slow]
DLU = str(Path(sys.executable).with_name("dlu"))


def test_serve_status_and_sigterm(tmp_path: Path) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    log = tmp_path / "serve.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen([DLU, "brain", "serve", "--db", f"sqlite:///{tmp_path / 'b.sqlite'}", "--port", str(port)],
                                stdout=out, stderr=subprocess.STDOUT)  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while f"Brain serving at http://127.0.0.1:{port}" not in log.read_text(errors="replace"):
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.1)
        status = subprocess.run([DLU, "brain", "status", "--brain", f"http://127.0.0.1:{port}"],
                                capture_output=True, text=True, timeout=60)  # fmt: skip
        assert status.returncode == 0, status.stderr
        assert f"database sqlite:///{tmp_path / 'b.sqlite'}, 0 running jobs" in status.stdout
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0, log.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)


def test_a_bad_db_url_is_refused_before_serving() -> None:
    done = subprocess.run(
        [DLU, "brain", "serve", "--db", "mysql://x/y"], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 2 and "SQLite or PostgreSQL only" in done.stderr
