"""The zygote process itself: binds the socket, preloads modules, then forks on request.

Started by `dlu_prime.zygote.ensure_started` as `python -m dlu_prime.zygote` (the command line
the reaper and tests look for); the client side and the wire protocol live in `dlu_prime.zygote`.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import importlib
import logging
import os
import selectors
import signal
import socket
import sys
import time
import traceback
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from dlu_prime.zygote_wire import (
    DEFAULT_IDLE_S,
    DEFAULT_REFILL_QUIET_S,
    MAX_SPARES,
    REFILL_QUIET_ENV,
    recv_message,
    send_message,
)

logger = logging.getLogger(__name__)


# -- the zygote -----------------------------------------------------------------------------------


class _Zygote:
    """Single-threaded (forking from a threaded process is unsafe): a select loop over the
    listener, SIGCHLD and the connections of running children.

    It keeps spare children forked ahead (as many as the largest burst of requests seen, up to
    MAX_SPARES): a fork of a process with torch loaded takes 25-130 ms here, so the ranks of a
    node starting together would otherwise wait for each other's forks. A spare blocks on its
    end of a socketpair until a request (with the client's descriptors) is handed to it. Spares
    are refilled once no fork was asked for `refill_quiet_s` (see zygote.DEFAULT_REFILL_QUIET_S).
    """

    def __init__(
        self,
        listener: socket.socket,
        preloaded: list[str],
        failed: dict[str, str],
        idle_s: float,
        refill_quiet_s: float = DEFAULT_REFILL_QUIET_S,
    ):
        self.listener = listener
        self.preloaded = preloaded
        self.failed = failed
        self.idle_s = idle_s
        self.refill_quiet_s = refill_quiet_s
        self.last_fork_request = float("-inf")
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
                # Requests come before refills: a spare is forked only when nothing waits, and
                # only once a burst of requests is over (its processes are starting).
                short = len(self.spares) < self.wanted_spares
                quiet_in = self.last_fork_request + self.refill_quiet_s - time.monotonic()
                ready = self.selector.select(timeout=(max(0.0, quiet_in) if short else 1.0))
                if short and not ready and quiet_in <= 0:
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
        self.last_fork_request = now
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
        freeze_heap()
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
        """A client hung up while its child runs: its requester is gone (clients hold the
        connection until the child's exit comes), so the child is killed, then reaped as usual.

        The child watches its requester itself (`zygote.die_with_requester`), but that watch is a
        thread: a child stopped, or blocked in native code holding the GIL, cannot run it, and
        would keep its devices and its place in a process group for good. The zygote, its
        parent, can always kill it: its pid (and group) cannot be reused before it is reaped.
        """
        with contextlib.suppress(OSError):
            if conn.recv(1, socket.MSG_PEEK):
                return  # clients send nothing after the request; ignore stray bytes
        self.selector.unregister(conn)
        conn.close()
        for pid, held in self.children.items():
            if held is conn:
                self.children[pid] = None
                _kill_orphan(pid)

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


def _kill_orphan(pid: int) -> None:
    """SIGKILL a running child whose requester is gone, with its group if it leads one."""
    try:
        own_group = os.getpgid(pid) == pid
        if own_group:
            os.killpg(pid, signal.SIGKILL)
        else:
            os.kill(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        return  # exited already (a zombie's group is gone too); reaped next
    logger.warning(
        "zygote %d: the requester of child %d hung up before its exit; killed it", os.getpid(), pid
    )


def freeze_heap() -> None:
    """Move every object alive now out of the cyclic collector's reach, in this process and in
    the children it forks next.

    Without it a child's first collections walk the zygote's 330,000 objects (torch's modules)
    and write to each one's header, copying the pages it shares with the zygote: 11 ms for one
    collection of a training process's start here, four processes at once on two cores. The
    collection first frees what is garbage already, so nothing garbage is kept for good.
    """
    gc.collect()
    gc.freeze()


def _preload(modules: Sequence[str]) -> tuple[list[str], dict[str, str]]:
    """Import `modules` with the cyclic collector off, then freeze what the process holds (out
    of the collector's reach, in it and in the children it forks) before the collector is on
    again (if it was).

    Imports only add objects that live as long as the zygote, yet each of the collector's
    passes walks all of them: importing torch, torch._dynamo and the rest ran 718 + 66 + 5
    collections here, 0.6 of 3.5 s of CPU (counted with `gc.callbacks`), while the job's own
    start competes for the two cores. Frozen before the collector is on: its first pass after
    would walk all 340,000 objects (0.2 s), and so would the full collection `freeze_heap`
    runs first, which finds the cyclic garbage the imports left: they left none (not one object
    of torch's preload, nor of the 130,000 of Ray's). Any there were would stay.
    """
    loaded: list[str] = []
    failed: dict[str, str] = {}
    collecting = gc.isenabled()
    gc.disable()
    try:
        for name in modules:
            try:
                importlib.import_module(name)
                loaded.append(name)
            except Exception as exc:  # a child imports it itself (and fails there, visibly)
                failed[name] = f"{type(exc).__name__}: {exc}"
    finally:
        gc.freeze()
        if collecting:
            gc.enable()
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
    # frozen once here; before each fork `freeze_heap` freezes only what is new
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
    refill_quiet_s = float(os.environ.get(REFILL_QUIET_ENV) or DEFAULT_REFILL_QUIET_S)
    try:
        _Zygote(listener, preloaded, failed, args.idle_s, refill_quiet_s).serve()
    finally:
        with contextlib.suppress(OSError):
            if os.stat(path).st_ino == inode:  # not a successor's socket
                path.unlink()
        listener.close()
