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
its process group when the alive pipe closes (the client died).
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import hashlib
import importlib
import importlib.util
import logging
import os
import pickle
import selectors
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

DIR_ENV = "DLU_ZYGOTE_DIR"  # where sockets live; default $TMPDIR/dlu-<uid>
IDLE_ENV = "DLU_ZYGOTE_IDLE_S"  # seconds with no live child before the zygote exits
DEFAULT_IDLE_S = 300.0
_HEADER = struct.Struct("!I")
_MAX_FDS = 8
MAX_SPARES = 16  # children forked ahead, at most (one per rank a node starts at once)
_MAX_MESSAGE = 64 << 20
_UNIX_PATH_MAX = 100  # sun_path is 108 bytes on Linux; keep a margin
# Packages whose sources the zygote may have preloaded: a change there means a new zygote.
_SOURCE_PACKAGES = ("dlu_api", "dlu_prime", "dlu_elastic")


class ZygoteError(RuntimeError):
    """The zygote could not be reached or refused a request."""


# -- the wire -------------------------------------------------------------------------------------


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
        ZygoteError: no zygote there, or it closed the connection without answering.
    """
    try:
        sock = connect(path, timeout_s)
    except OSError as exc:
        raise ZygoteError(f"no zygote at {path}: {exc}") from exc
    with sock:
        send_message(sock, message)
        try:
            answer, _ = recv_message(sock)
        except TimeoutError as exc:
            raise ZygoteError(f"the zygote at {path} did not answer within {timeout_s} s") from exc
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


# -- the zygote -----------------------------------------------------------------------------------


class _Zygote:
    """Single-threaded (forking from a threaded process is unsafe): a select loop over the
    listener, SIGCHLD and the connections of running children.

    It keeps spare children forked ahead (as many as the largest burst of requests seen, up to
    MAX_SPARES): a fork of a process with torch loaded takes 25-130 ms here, so the ranks of a
    node starting together would otherwise wait for each other's forks. A spare blocks on its
    end of a socketpair until a request (with the client's descriptors) is handed to it.
    """

    def __init__(self, listener: socket.socket, preloaded: list[str], failed: dict[str, str], idle_s: float):
        self.listener = listener
        self.preloaded = preloaded
        self.failed = failed
        self.idle_s = idle_s
        self.children: dict[int, socket.socket | None] = {}  # running: pid -> its client
        self.spares: dict[int, socket.socket] = {}  # forked ahead: pid -> the zygote's end
        self.wanted_spares = 1
        self.burst: list[float] = []  # times of recent fork requests
        self.selector = selectors.DefaultSelector()
        self.wake_r, self.wake_w = os.pipe()
        os.set_blocking(self.wake_r, False)
        os.set_blocking(self.wake_w, False)
        self.idle_since = time.monotonic()

    def serve(self) -> None:
        signal.set_wakeup_fd(self.wake_w)
        signal.signal(signal.SIGCHLD, lambda *_: None)  # a handler, so the wakeup fd is written
        self.selector.register(self.listener, selectors.EVENT_READ, "accept")
        self.selector.register(self.wake_r, selectors.EVENT_READ, "sigchld")
        try:
            while True:
                # Requests come before refills: a spare is forked only when nothing waits.
                short = len(self.spares) < self.wanted_spares
                ready = self.selector.select(timeout=0 if short else 1.0)
                if short and not ready:
                    self._fork_child()
                    continue
                for key, _ in ready:
                    if key.data == "accept":
                        self._accept_all()
                    elif key.data == "sigchld":
                        with contextlib.suppress(BlockingIOError):
                            os.read(self.wake_r, 4096)
                    else:
                        self._client_closed(key.data)
                self._reap()
                if self.children:
                    self.idle_since = time.monotonic()
                elif time.monotonic() - self.idle_since > self.idle_s:
                    logger.info("zygote %d: idle for %.0f s, exiting", os.getpid(), self.idle_s)
                    return
        finally:
            for sock in self.spares.values():
                sock.close()  # EOF: the spares exit

    def _accept_all(self) -> None:
        """Every waiting request before any refill (ranks starting together wait for no fork)."""
        while True:
            try:
                conn, _ = self.listener.accept()
            except BlockingIOError:
                return
            self._handle(conn)

    def _handle(self, conn: socket.socket) -> None:
        conn.settimeout(10.0)
        fds: list[int] = []
        try:
            message, fds = recv_message(conn)
            if message is None:
                conn.close()
                return
            if message.get("op") == "ping":
                answer = {"pid": os.getpid(), "preloaded": self.preloaded, "failed": self.failed}
                send_message(conn, {**answer, "spares": sorted(self.spares)})
                conn.close()
            elif message.get("op") == "fork":
                self._start(conn, message, fds)
            else:
                send_message(conn, {"error": f"unknown op {message.get('op')!r}"})
                conn.close()
        except Exception as exc:
            with contextlib.suppress(Exception):
                send_message(conn, {"error": f"{type(exc).__name__}: {exc}"})
            conn.close()
        finally:
            for fd in fds:
                with contextlib.suppress(OSError):
                    os.close(fd)  # the child has its own copies
        self.idle_since = time.monotonic()

    def _start(self, conn: socket.socket, message: dict[str, Any], fds: list[int]) -> None:
        now = time.monotonic()
        self.burst = [t for t in self.burst if now - t < 2.0] + [now]
        self.wanted_spares = min(MAX_SPARES, max(self.wanted_spares, len(self.burst)))
        job = {"target": message["target"], "args": tuple(message.get("args", ()))}
        pid = self._hand_to_spare(job, fds)
        if pid is None:
            pid = self._fork_child(conn)  # no spare left: a new child (without this connection)
            self._hand(pid, job, fds)
        send_message(conn, {"pid": pid})
        conn.settimeout(None)
        self.children[pid] = conn
        self.selector.register(conn, selectors.EVENT_READ, conn)

    def _hand_to_spare(self, job: dict[str, Any], fds: list[int]) -> int | None:
        while self.spares:
            pid = next(iter(self.spares))
            try:
                self._hand(pid, job, fds)
            except OSError:
                continue  # that spare died; _hand dropped it
            return pid
        return None

    def _hand(self, pid: int, job: dict[str, Any], fds: list[int]) -> None:
        sock = self.spares.pop(pid)
        try:
            send_message(sock, job, fds)
        finally:
            sock.close()

    def _fork_child(self, *close: socket.socket) -> int:
        """A spare: a child waiting on a socketpair for the request it will run.

        `close`: connections the child must not hold (a client's connection held by a child
        would keep its end open after the zygote died, and the client would never see EOF).
        """
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            ours.close()
            for sock in close:
                sock.close()
            self._in_child(theirs)  # never returns
        theirs.close()
        self.spares[pid] = ours
        return pid

    def _in_child(self, sock: socket.socket) -> None:
        code = 1
        try:
            signal.set_wakeup_fd(-1)
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            for fd in (self.wake_r, self.wake_w):
                os.close(fd)
            self.selector.close()
            self.listener.close()
            for other in [*self.children.values(), *self.spares.values()]:
                if other is not None:
                    other.close()
            job, fds = recv_message(sock)
            sock.close()
            if job is None:  # the zygote is gone or exiting: a spare just ends
                os._exit(0)
            code = int(job["target"](*job["args"], *fds) or 0)
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 1
        except BaseException:
            with contextlib.suppress(Exception):
                traceback.print_exc()
        finally:
            for stream in (sys.stdout, sys.stderr):
                with contextlib.suppress(Exception):
                    stream.flush()
            os._exit(code)

    def _client_closed(self, conn: socket.socket) -> None:
        """A client hung up while its child runs: keep reaping the child, drop the connection."""
        with contextlib.suppress(OSError):
            if conn.recv(1, socket.MSG_PEEK):
                return  # clients send nothing after the request; ignore stray bytes
        self.selector.unregister(conn)
        conn.close()
        for pid, held in self.children.items():
            if held is conn:
                self.children[pid] = None

    def _reap(self) -> None:
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            spare = self.spares.pop(pid, None)
            if spare is not None:
                spare.close()
                continue
            conn = self.children.pop(pid, None)
            if conn is None:
                continue
            with contextlib.suppress(OSError):
                send_message(conn, {"exit": os.waitstatus_to_exitcode(status)})
            with contextlib.suppress(KeyError, ValueError):
                self.selector.unregister(conn)
            conn.close()


def _preload(modules: Sequence[str]) -> tuple[list[str], dict[str, str]]:
    loaded: list[str] = []
    failed: dict[str, str] = {}
    for name in modules:
        try:
            importlib.import_module(name)
            loaded.append(name)
        except Exception as exc:  # a child imports it itself (and fails there, visibly)
            failed[name] = f"{type(exc).__name__}: {exc}"
    return loaded, failed


def _bind(path: Path) -> tuple[socket.socket, int]:
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    tmp = path.with_name(f"{path.name}.{os.getpid()}")
    with contextlib.suppress(FileNotFoundError):
        tmp.unlink()
    listener.bind(str(tmp))
    os.chmod(tmp, 0o600)
    listener.listen(512)
    os.replace(tmp, path)  # appears only once it listens
    return listener, os.stat(path).st_ino


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--socket", required=True)
    parser.add_argument("--preload", default="")
    parser.add_argument("--idle-s", type=float, default=DEFAULT_IDLE_S)
    parser.add_argument("--foreground", action="store_true", help="do not daemonize")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    path = Path(args.socket)
    listener, inode = _bind(path)
    if not args.foreground and os.fork() != 0:
        os._exit(0)  # the starter returns; the zygote is nobody's child but init's
    started = time.perf_counter()
    preloaded, failed = _preload([m for m in args.preload.split(",") if m])
    logger.info(
        "zygote %d at %s: preloaded %s in %.2f s%s",
        os.getpid(),
        path,
        ", ".join(preloaded),
        time.perf_counter() - started,
        f"; failed: {failed}" if failed else "",
    )
    listener.setblocking(False)
    try:
        _Zygote(listener, preloaded, failed, args.idle_s).serve()
    finally:
        with contextlib.suppress(OSError):
            if os.stat(path).st_ino == inode:  # not a successor's socket
                path.unlink()
        listener.close()


if __name__ == "__main__":
    main()
