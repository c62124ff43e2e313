"""The node's zygotes: a process with modules preloaded that forks the processes needing them.

Two kinds use it: training processes fork from a zygote with torch preloaded (below), and the
embedded Ray's worker processes from one with Ray preloaded (`dlu_prime.ray_workers`).

`import torch` plus the `torch._dynamo` an optimizer pulls in costs 8 s of CPU here. A
forkserver per actor paid that once per rank (four ranks on two cores: 16 s of CPU before the
first step) and again after every actor restart. One zygote per node and Python environment
pays it once: every rank of every job on the node forks from it, it outlives actor restarts
(the role tier forks instead of importing), and `dlu run` starts it beside the embedded Ray so
that the import overlaps Ray's own start.

The zygote is found by a socket path derived from what makes its preloaded modules valid: the
interpreter, the environment's prefix, the preload list and the DLU sources (a changed
checkout gets a new zygote). It is daemonized (no actor is its parent, so killing an actor
leaves it), serves one request per connection and exits after `idle_s` with no process alive.

Protocol (AF_UNIX stream, one connection per request): the client sends a length-prefixed
pickled dict, with file descriptors attached for a fork:
`{"op": "ping"}` -> `{"pid", "preloaded": [...], "failed": {module: error}}`;
`{"op": "fork", "target", "args"}` + fds (events pipe, alive pipe, stdout, stderr) ->
`{"pid": child}` at once and `{"exit": code}` when the child has exited. The child runs
`target(*args, events_fd, alive_fd)` with stdout/stderr on the client's descriptors; it kills
its process group when the alive pipe closes (the client died). A client holds its connection
until the exit comes: when it closes earlier (the client died), the zygote kills the child and
its group too, which also ends a child too stopped or blocked to run its own watch.

This module is the client side; the framing of the messages is `dlu_prime.zygote_wire`, the
zygote process `dlu_prime.zygote_server`.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import importlib
import importlib.util
import logging
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from dlu_prime.zygote_wire import (
    DEFAULT_IDLE_S,
    DEFAULT_REFILL_QUIET_S,
    MAX_SPARES,
    REFILL_QUIET_ENV,
    ZygoteError,
    recv_message,
    send_message,
)

__all__ = [
    "DEFAULT_IDLE_S",
    "DEFAULT_REFILL_QUIET_S",
    "MAX_SPARES",
    "REFILL_QUIET_ENV",
    "ZygoteError",
    "recv_message",
    "send_message",
]

logger = logging.getLogger(__name__)

DIR_ENV = "DLU_ZYGOTE_DIR"  # where sockets live; default $TMPDIR/dlu-<uid>
IDLE_ENV = "DLU_ZYGOTE_IDLE_S"  # seconds with no live child before the zygote exits
_UNIX_PATH_MAX = 100  # sun_path is 108 bytes on Linux; keep a margin
# Packages whose sources the zygote may have preloaded: a change there means a new zygote.
_SOURCE_PACKAGES = ("dlu_api", "dlu_prime", "dlu_elastic")


# -- where a zygote lives -------------------------------------------------------------------------


def _sources_stamp() -> str:
    """Newest modification time of the DLU sources the zygote may have preloaded."""
    newest = 0.0
    for name in _SOURCE_PACKAGES:
        found = importlib.util.find_spec(name)
        if found is None or not found.submodule_search_locations:
            continue
        for location in found.submodule_search_locations:
            for path in Path(location).rglob("*.py"):
                with contextlib.suppress(OSError):
                    newest = max(newest, path.stat().st_mtime)
    return repr(newest)


def socket_dir() -> Path:
    configured = os.environ.get(DIR_ENV)
    if configured:
        return Path(configured)
    base = Path(tempfile.gettempdir()) / f"dlu-{os.getuid()}"
    if len(str(base)) > _UNIX_PATH_MAX - 24:
        base = Path("/tmp") / f"dlu-{os.getuid()}"
    return base


def socket_path(preload: Sequence[str], salt: str = "") -> Path:
    """The socket of the zygote that suits this interpreter, environment and preload list.

    `salt`: whatever else the preloaded modules captured when imported (settings they read from
    the environment, say); another salt means another zygote.
    """
    torch_spec = importlib.util.find_spec("torch")
    key = "\0".join(
        [
            sys.executable,
            sys.prefix,
            torch_spec.origin if torch_spec and torch_spec.origin else "",
            ",".join(preload),
            _sources_stamp(),
            salt,
        ]
    )
    digest = hashlib.sha256(key.encode()).hexdigest()[:16]
    path = socket_dir() / f"z-{digest}.sock"
    if len(str(path)) > _UNIX_PATH_MAX:
        raise ZygoteError(f"zygote socket path {path} is too long; set {DIR_ENV} to a short directory")
    return path


# -- the client side ------------------------------------------------------------------------------


def connect(path: Path, timeout_s: float | None = 5.0) -> socket.socket:
    """A connection to the zygote at `path`.

    Raises:
        OSError: nothing listens there (ENOENT, ECONNREFUSED) or the connect timed out.
    """
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(timeout_s)
    try:
        sock.connect(str(path))
    except BaseException:
        sock.close()
        raise
    return sock


def _listening(path: Path) -> bool:
    try:
        connect(path, 1.0).close()
    except OSError:
        return False
    return True


def ensure_started(preload: Sequence[str], idle_s: float | None = None, salt: str = "") -> Path:
    """The socket of a zygote for `preload`, starting one if none listens; does not wait for its
    imports (a connection made meanwhile waits in the listen backlog).

    Raises:
        ZygoteError: a new zygote did not bind its socket within 30 s (its log is named).
    """
    path = socket_path(preload, salt)
    if _listening(path):
        return path
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    lock_path = path.with_suffix(".lock")
    with open(lock_path, "a+") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one starter per node; the others find it listening
        if _listening(path):
            return path
        with contextlib.suppress(FileNotFoundError):
            path.unlink()  # a stale socket of a zygote that is gone
        log_path = path.with_suffix(".log")
        idle = idle_s if idle_s is not None else float(os.environ.get(IDLE_ENV, DEFAULT_IDLE_S))
        with open(log_path, "ab") as log:
            starter = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    __name__,
                    "--socket",
                    str(path),
                    "--preload",
                    ",".join(preload),
                    "--idle-s",
                    str(idle),
                ],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                start_new_session=True,
                close_fds=True,
            )
        starter.wait(30)  # it forks the zygote and exits once the socket is bound
        deadline = time.monotonic() + 30.0
        while not path.exists():
            if time.monotonic() > deadline:
                raise ZygoteError(f"the zygote did not bind {path} within 30 s; see {log_path}")
            time.sleep(0.01)
        logger.info("started a zygote at %s (preloading %s)", path, ", ".join(preload))
    return path


def request(path: Path, message: dict[str, Any], timeout_s: float | None) -> dict[str, Any]:
    """One request without descriptors, its one answer.

    Raises:
        ZygoteError: no zygote there, or it closed or reset the connection without answering
            (a zygote killed while the connection waited in its backlog resets it).
    """
    try:
        sock = connect(path, timeout_s)
    except OSError as exc:
        raise ZygoteError(f"no zygote at {path}: {exc}") from exc
    with sock:
        try:
            send_message(sock, message)
            answer, _ = recv_message(sock)
        except TimeoutError as exc:
            raise ZygoteError(f"the zygote at {path} did not answer within {timeout_s} s") from exc
        except (OSError, EOFError) as exc:
            raise ZygoteError(f"the zygote at {path} dropped the connection: {exc}") from exc
    if answer is None:
        raise ZygoteError(f"the zygote at {path} closed the connection")
    return answer


def fork(
    path: Path,
    target: Callable[..., int],
    args: tuple[Any, ...],
    fds: Sequence[int],
    timeout_s: float = 120.0,
) -> tuple[int, socket.socket]:
    """Fork `target(*args, *fds)` in the zygote; (pid, the connection its exit code comes on).

    `timeout_s` covers a zygote still importing its preload list.

    Raises:
        ZygoteError: no zygote there, or it could not fork.
    """
    try:
        sock = connect(path, timeout_s)
    except OSError as exc:
        raise ZygoteError(f"no zygote at {path}: {exc}") from exc
    try:
        send_message(sock, {"op": "fork", "target": target, "args": args}, fds)
        answer, _ = recv_message(sock)
    except (OSError, EOFError) as exc:
        sock.close()
        raise ZygoteError(f"the zygote at {path} failed during a fork request: {exc}") from exc
    if answer is None or "pid" not in answer:
        sock.close()
        detail = answer.get("error") if answer else "connection closed"
        raise ZygoteError(f"the zygote at {path} could not fork: {detail}")
    sock.settimeout(None)
    return int(answer["pid"]), sock


def stop_all(directory: Path | None = None, timeout_s: float = 5.0) -> list[int]:
    """SIGTERM every zygote answering in `directory` (default: this user's); their pids.

    Running training processes are not touched: they belong to their actors.
    """
    stopped: list[int] = []
    for path in sorted((directory or socket_dir()).glob("z-*.sock")):
        try:
            pid = int(request(path, {"op": "ping"}, timeout_s)["pid"])
        except (ZygoteError, KeyError, ValueError):
            continue
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
            stopped.append(pid)
    return stopped


def die_with_requester(alive_fd: int, name: str = "dlu-requester-watch") -> None:
    """In a forked child: SIGKILL the child's process group once the process that asked for it is
    gone (EOF on a pipe only that process writes to). The child must lead its own group."""

    def watch() -> None:
        with contextlib.suppress(OSError):
            while os.read(alive_fd, 1):
                pass
        with contextlib.suppress(OSError):
            os.killpg(os.getpid(), signal.SIGKILL)
        os._exit(1)

    threading.Thread(target=watch, name=name, daemon=True).start()


def main(argv: Sequence[str] | None = None) -> None:
    """The zygote process (`python -m dlu_prime.zygote`); served by `dlu_prime.zygote_server`,
    imported only here so that clients do not load the server's code."""
    from dlu_prime import zygote_server

    zygote_server.main(argv)


if __name__ == "__main__":
    main()
