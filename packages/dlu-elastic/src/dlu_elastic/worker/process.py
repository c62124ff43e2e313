"""Training processes forked from the node's zygote, which has torch preloaded.

A crash of a training process must not cost a Ray actor restart plus a fresh `import torch`
(seconds). Every `TrainingLauncher.start()` asks the node's zygote (`zygote.py`: one process
per node and Python environment, torch imported once, shared by every rank and every job) to
fork a process that only has to take over the actor's environment, join the process group and
run the user's code (milliseconds). The zygote outlives actor restarts, so a replaced actor
forks too.

This module is the launcher side: `TrainingLauncher` resolves a `ProcessSpec` (`process_types`)
and asks the zygote to fork; `TrainingProcess` follows the child's events and exit code. What
runs in the child is `process_child.zygote_child` (imported here, so the zygote that preloads
this module has it too).

Processes are their own process group (so `terminate()` reaches the DataLoader workers they
fork), and that group is killed when the actor that started them dies (a pipe only the actor
holds reaches EOF).
"""

from __future__ import annotations

import atexit
import contextlib
import multiprocessing.connection
import os
import signal
import socket
import sys
import threading
import time
import weakref
from collections import deque
from collections.abc import Sequence
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from dlu_api.spec.entrypoint import EntrypointKind
from dlu_elastic.worker.process_child import ChildPayload, ForwardingHealth, context_from_env, zygote_child
from dlu_elastic.worker.process_types import BACKENDS, DEVICE_ENV, ProcessEvent, ProcessEventKind, ProcessSpec
from dlu_elastic.worker.warmup import PRELOAD
from dlu_prime import zygote
from dlu_prime.worker.rank_logs import fds_for_child

# Re-exported: tests, benchmarks and the actor import these from here.
__all__ = [
    "BACKENDS",
    "DEVICE_ENV",
    "ForwardingHealth",
    "ProcessEvent",
    "ProcessEventKind",
    "ProcessSpec",
    "TrainingLauncher",
    "TrainingProcess",
    "context_from_env",
]

_PG_ENV = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
_MAX_BUFFERED_EVENTS = 100_000


class TrainingProcess:
    """A running (or finished) training process. Methods may be called from any thread.

    The process is the zygote's child: its exit code comes on `status` (the connection of the
    fork request), its events on `conn`; `alive_fd` is the one writer of the pipe whose EOF
    kills the process's group, so it is closed only once the process has exited.
    """

    def __init__(self, pid: int, status: socket.socket, conn: Connection, alive_fd: int, spec: ProcessSpec):
        self.spec = spec
        self.pid = pid
        self.started_at = time.time()
        self._status = status
        self._conn = conn
        self._alive_fd = alive_fd
        self._events: deque[ProcessEvent] = deque(maxlen=_MAX_BUFFERED_EVENTS)
        self._events_lock = threading.Lock()
        self._last_failure: str | None = None
        self._failure_code: int | None = None
        self._beaten = False
        self._exit_code: int | None = None
        self._exited = threading.Event()
        self._gone = threading.Event()  # exited, or a zombie: see end()
        # Set when something its watcher acts on arrives (the exit, a failure, the first beat,
        # any other event but later beats, which are read at the watcher's own pace); the
        # watcher may set it too, for news of its own, and clears it before it reads.
        self.activity = threading.Event()
        self._monitor = threading.Thread(target=self._follow, name=f"dlu-training-{self.pid}", daemon=True)
        self._monitor.start()

    def __repr__(self) -> str:
        return f"TrainingProcess(pid={self.pid}, exit={self.poll()}, entrypoint={self.spec.entrypoint!r})"

    # -- exit status ----------------------------------------------------------------------------

    def poll(self) -> int | None:
        """The exit code, or None while it runs. A process killed by signal N gives -N.

        Set only after the process's last events were read, so they are in `events()` by then.
        """
        return self._exit_code

    def wait(self, timeout: float | None = None) -> int | None:
        """Wait up to `timeout` seconds (None: forever) for the exit; the exit code or None."""
        self._exited.wait(timeout)
        return self._exit_code

    def ending_code(self) -> int | None:
        """The exit code once it exited, or the one its FAILURE event announced (it is exiting:
        what remains are its exit hooks and the interpreter's teardown, tens of milliseconds
        that a restart need not wait for); None while it runs."""
        code = self.poll()
        return code if code is not None else self._failure_code

    @property
    def alive(self) -> bool:
        return self.poll() is None

    def terminate(self, grace_s: float = 5.0) -> int | None:
        """SIGTERM to the process group, SIGKILL after `grace_s`; the exit code.

        Whatever is left of the group (DataLoader workers, subprocesses) is killed too.
        """
        code = self.poll()
        if code is None:
            self._signal(signal.SIGTERM)
            code = self.wait(grace_s)
            if code is None:
                self._signal(signal.SIGKILL)
                code = self.wait(10.0)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pid, signal.SIGKILL)  # orphans; the group exists only while they do
        return code

    def end(self, grace_s: float = 5.0) -> None:
        """`terminate()` before a restart: SIGTERM, SIGKILL after `grace_s`, and back as soon as
        the process is a zombie (its memory and devices are freed by then), not once the zygote
        has reaped it and passed its exit code on: the zygote is busiest exactly then, forking
        the next round's processes. Whatever is left of its group is killed too."""
        if not self._gone.is_set():
            self._signal(signal.SIGTERM)
            if not self._gone.wait(grace_s):
                self._signal(signal.SIGKILL)
                self._gone.wait(10.0)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pid, signal.SIGKILL)

    def request_stop(self) -> None:
        """SIGTERM to the process group, without waiting (`terminate()` later waits and kills)."""
        if self.poll() is None:
            self._signal(signal.SIGTERM)

    def _signal(self, sig: int) -> None:
        try:
            os.killpg(self.pid, sig)  # its own group once the child has called setpgid
        except (ProcessLookupError, PermissionError):
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, sig)

    # -- events ---------------------------------------------------------------------------------

    def events(self) -> list[ProcessEvent]:
        """Drain the events received so far (oldest first)."""
        with self._events_lock:
            drained = list(self._events)
            self._events.clear()
        return drained

    @property
    def last_failure(self) -> str | None:
        """The traceback of the FAILURE event, if one came (kept after events() drains it)."""
        return self._last_failure

    def _push(self, event: Any) -> None:
        if not isinstance(event, ProcessEvent):
            return
        if event.kind is ProcessEventKind.FAILURE:
            self._last_failure = event.message
            self._failure_code = event.exit_code if event.exit_code else 1
        with self._events_lock:
            self._events.append(event)
        if event.kind is not ProcessEventKind.HEARTBEAT or not self._beaten:
            self._beaten = self._beaten or event.kind is ProcessEventKind.HEARTBEAT
            self.activity.set()

    def _follow(self) -> None:
        """Read events as they come (a child never blocks on a full pipe), then the exit code."""
        conn: Connection | None = self._conn
        code: int | None = None
        try:
            while code is None:
                waiting: list[Any] = [self._status] if conn is None else [conn, self._status]
                ready = multiprocessing.connection.wait(waiting)
                if conn is not None and conn in ready:
                    try:
                        self._push(conn.recv())
                    except (EOFError, OSError):
                        conn = None  # closed (grandchildren may keep it open; then only the exit)
                        if _became_zombie(self.pid):
                            self._gone.set()
                    continue
                code = self._read_exit()
            while conn is not None and conn.poll(0):  # what it sent before exiting
                self._push(conn.recv())
        except (EOFError, OSError):
            pass
        finally:
            self._exit_code = code if code is not None else -signal.SIGKILL
            self._exited.set()
            self._gone.set()
            self.activity.set()
            for close in (self._conn.close, self._status.close, lambda: os.close(self._alive_fd)):
                with contextlib.suppress(OSError):
                    close()

    def _read_exit(self) -> int:
        try:
            message, _ = zygote.recv_message(self._status)
        except (OSError, EOFError, zygote.ZygoteError):
            message = None
        if message is not None and "exit" in message:
            return int(message["exit"])
        # The zygote died: its child is ours to end, its exit code is lost.
        self._last_failure = self._last_failure or "the zygote that forked this process died"
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pid, signal.SIGKILL)
        return -signal.SIGKILL


def _became_zombie(pid: int, tries: int = 20) -> bool:
    """Whether `pid` exited (a zombie, or already reaped), looking for up to ~10 ms: a process's
    pipes close during its exit just before it becomes a zombie."""
    for _ in range(tries):
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            return True  # reaped already
        if state in ("Z", "X"):
            return True
        time.sleep(0.0005)
    return False


_live: weakref.WeakSet[TrainingProcess] = weakref.WeakSet()


@atexit.register
def _terminate_live_processes() -> None:
    # multiprocessing joins non-daemon children at exit (its hook runs after this one): without
    # this an actor that exits while training runs would hang. Training processes are not
    # daemonic because daemonic processes may not start DataLoader workers.
    for proc in list(_live):
        with contextlib.suppress(Exception):
            proc.terminate(grace_s=1.0)


class TrainingLauncher:
    """Forks training processes from the node's zygote (torch preloaded).

    `preload`: more modules for the zygote to import once (they must be importable from the
    actor's environment, not only from a job's working directory); another list means another
    zygote.
    """

    def __init__(self, preload: Sequence[str] = ()) -> None:
        self._preload = list(dict.fromkeys([*PRELOAD, *preload]))
        self._socket: Path | None = None
        self._processes: list[TrainingProcess] = []
        self.preloaded: bool | None = None  # whether children find torch imported; set by warm_up
        self.warm_up_s: float | None = None

    @property
    def preload(self) -> list[str]:
        return list(self._preload)

    def prepare(self) -> Path:
        """Start the node's zygote if none runs, without waiting for its imports; its socket.

        Raises:
            zygote.ZygoteError: a new zygote could not be started.
        """
        self._socket = zygote.ensure_started(self._preload)
        return self._socket

    def warm_up(self, timeout_s: float = 120.0) -> float:
        """Wait until the zygote has imported torch; seconds waited.

        Idempotent. Sets `preloaded`: False means the zygote could not import torch, so every
        training process imports it itself (and fails there if it cannot).

        Raises:
            RuntimeError: the zygote did not answer within `timeout_s`.
        """
        if self.warm_up_s is not None:
            return self.warm_up_s
        t0 = time.perf_counter()
        try:
            answer = zygote.request(self.prepare(), {"op": "ping"}, timeout_s)
        except zygote.ZygoteError as exc:
            raise RuntimeError(f"the zygote did not answer within {timeout_s:.0f} s: {exc}") from exc
        self.preloaded = "torch" in answer.get("preloaded", ())
        self.warm_up_s = time.perf_counter() - t0
        return self.warm_up_s

    def start(self, spec: ProcessSpec) -> TrainingProcess:
        """Fork a training process for `spec`.

        Raises:
            ValueError: the entrypoint is not an accepted form, or the process group cannot be set
                up from `spec.env` (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT missing).
            FileNotFoundError: a script entrypoint or the working directory does not exist.
            zygote.ZygoteError: no zygote could be started or reached.
        """
        payload = self._payload(spec)
        reader, writer = multiprocessing.connection.Pipe(duplex=False)
        alive_r, alive_w = os.pipe()
        args = (payload, dict(os.environ), list(sys.path))
        std_fds, opened = fds_for_child(spec.output)
        fds = [writer.fileno(), alive_r, *std_fds, *spec.pass_fds]
        try:
            try:
                pid, status = zygote.fork(self._socket or self.prepare(), zygote_child, args, fds)
            except zygote.ZygoteError:
                # The zygote may have exited (idle) or died since: start one and try once more.
                pid, status = zygote.fork(self.prepare(), zygote_child, args, fds)
        except BaseException:
            reader.close()
            os.close(alive_w)
            raise
        finally:
            writer.close()  # the child has its own copy: EOF here once it (and its children) exit
            os.close(alive_r)
            for fd in opened:  # the rank's log files: the child holds them now
                os.close(fd)
        proc = TrainingProcess(pid, status, reader, alive_w, spec)
        self._processes = [p for p in self._processes if p.poll() is None]  # forget finished ones
        self._processes.append(proc)
        _live.add(proc)
        return proc

    @property
    def processes(self) -> list[TrainingProcess]:
        """Processes this launcher started, the running ones and possibly some finished ones."""
        return list(self._processes)

    def shutdown(self, grace_s: float = 5.0) -> None:
        """Terminate every process this launcher started that still runs.

        The zygote stays: it serves the whole node and exits once idle.
        """
        for proc in self._processes:
            proc.terminate(grace_s)
            _live.discard(proc)
        self._processes.clear()

    def _payload(self, spec: ProcessSpec) -> ChildPayload:
        entry = spec.resolved_entrypoint()
        workdir = os.path.abspath(spec.workdir or os.getcwd())
        if not os.path.isdir(workdir):
            raise FileNotFoundError(f"working directory {workdir} does not exist")
        if entry.kind is EntrypointKind.SCRIPT:
            script = Path(entry.target)
            if not script.is_absolute():
                script = Path(workdir) / script
            if not script.is_file():
                raise FileNotFoundError(f"entrypoint script {entry.target!r} not found at {script}")
        env = dict(spec.env)
        env.setdefault(DEVICE_ENV, spec.device)
        setup = spec.setup_process_group and entry.kind is EntrypointKind.OBJECT
        if setup:
            missing = [name for name in _PG_ENV if not env.get(name)]
            if missing:
                raise ValueError(
                    f"cannot set up the process group for {spec.entrypoint!r}: env lacks "
                    f"{', '.join(missing)} (or pass setup_process_group=False)"
                )
        return ChildPayload(
            kind=entry.kind,
            target=entry.target,
            args=entry.args,
            env=env,
            workdir=workdir,
            setup_process_group=setup,
            backend=spec.resolved_backend(),
            device=spec.device,
            pg_timeout_s=spec.pg_timeout_s,
        )
