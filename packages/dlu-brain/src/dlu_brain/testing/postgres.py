"""A real PostgreSQL server for tests: its own data folder, 127.0.0.1 and a free port, stopped and
started again by PID (the database-down faults are injected on this process).

The binaries are Debian's (`postgresql`, installed by `.ci/run` where absent) or any `initdb` and
`postgres` on PATH. PostgreSQL refuses to run as root, so under root the server runs as the
system user the package made (`postgres`), through `subprocess.Popen(user=...)`; a machine with
neither the binaries nor such a user gets `PostgresUnavailable` with the reason, which the tests
turn into a skip naming it.
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

__all__ = ["PostgresServer", "PostgresUnavailable", "find_binaries"]

SERVER_USER = "postgres"


class PostgresUnavailable(RuntimeError):
    """No PostgreSQL server can be started on this machine; the message says why."""


def find_binaries() -> Path:
    """The folder holding `initdb` and `postgres` (PATH first, then Debian's versioned folders)."""
    initdb = shutil.which("initdb")
    if initdb:
        folder = Path(os.path.realpath(initdb)).parent
        if (folder / "postgres").exists():
            return folder
    for folder in sorted(glob.glob("/usr/lib/postgresql/*/bin"), reverse=True):
        if (Path(folder) / "initdb").exists() and (Path(folder) / "postgres").exists():
            return Path(folder)
    raise PostgresUnavailable(
        "no PostgreSQL server binaries (initdb, postgres) on PATH or in /usr/lib/postgresql/*/bin; "
        "install Debian's `postgresql` package (.ci/run does)"
    )


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class PostgresServer:
    """One server process; `url` is a SQLAlchemy URL for its `dlu` superuser (trust auth, loopback)."""

    def __init__(self) -> None:
        self.bin = find_binaries()
        self._user: str | None = None
        if os.geteuid() == 0:
            try:
                pwd.getpwnam(SERVER_USER)
            except KeyError:
                raise PostgresUnavailable(
                    f"running as root and there is no {SERVER_USER!r} user to run PostgreSQL as "
                    "(PostgreSQL refuses root); install Debian's `postgresql` package, which creates it"
                ) from None
            self._user = SERVER_USER
        self.root = Path(tempfile.mkdtemp(prefix="dlu-pg-"))
        self.data = self.root / "data"
        self.port = _free_port()
        self.process: subprocess.Popen[bytes] | None = None
        self.log = self.root / "server.log"
        if self._user:
            user = pwd.getpwnam(self._user)
            os.chown(self.root, user.pw_uid, user.pw_gid)
        self._run([str(self.bin / "initdb"), "-D", str(self.data), "-U", "dlu", "--auth=trust", "-E", "UTF8"])

    @property
    def url(self) -> str:
        return f"postgresql+psycopg://dlu@127.0.0.1:{self.port}/postgres"

    def _popen_user(self) -> dict[str, object]:
        return (
            {"user": self._user, "group": pwd.getpwnam(self._user).pw_gid, "extra_groups": []}
            if self._user
            else {}
        )

    def _run(self, argv: list[str]) -> None:
        done = subprocess.run(argv, capture_output=True, timeout=120, **self._popen_user())  # type: ignore[call-overload]
        if done.returncode != 0:
            raise PostgresUnavailable(
                f"{argv[0]} failed ({done.returncode}): {done.stderr.decode(errors='replace')[-800:]}"
            )

    def start(self, timeout_s: float = 60.0) -> None:
        """Start the server and wait until it accepts connections on its port."""
        assert self.process is None or self.process.poll() is not None, "already running"
        log = open(self.log, "ab")  # noqa: SIM115 - the server writes it after this returns
        argv = [str(self.bin / "postgres"), "-D", str(self.data), "-p", str(self.port),
                "-h", "127.0.0.1", "-k", str(self.root), "-c", "fsync=off"]  # fmt: skip
        self.process = subprocess.Popen(argv, stdout=log, stderr=log, **self._popen_user())  # type: ignore[call-overload]
        log.close()
        deadline = time.monotonic() + timeout_s
        while not self._accepting():
            if self.process.poll() is not None:
                raise PostgresUnavailable(f"postgres exited {self.process.returncode}: {self._log_tail()}")
            if time.monotonic() > deadline:
                self.stop()
                raise PostgresUnavailable(
                    f"postgres did not accept connections in {timeout_s:.0f} s: {self._log_tail()}"
                )
            time.sleep(0.1)

    def _accepting(self) -> bool:
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
            return (self.data / "postmaster.pid").exists()
        return False

    def _log_tail(self) -> str:
        with contextlib.suppress(OSError):
            return self.log.read_text(errors="replace")[-800:]
        return "(no log)"

    def stop(self, fast: bool = True, timeout_s: float = 60.0) -> None:
        """Stop the server process by its PID (SIGINT: PostgreSQL's fast shutdown; or SIGKILL)."""
        process = self.process
        if process is None or process.poll() is not None:
            return
        process.send_signal(signal.SIGINT if fast else signal.SIGKILL)
        try:
            process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=timeout_s)

    def close(self) -> None:
        self.stop()
        shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> PostgresServer:
        self.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.close()
