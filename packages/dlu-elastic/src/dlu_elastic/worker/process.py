"""Training processes forked from the node's zygote, which has torch preloaded.

A crash of a training process must not cost a Ray actor restart plus a fresh `import torch`
(seconds). Every `TrainingLauncher.start()` asks the node's zygote (`zygote.py`: one process
per node and Python environment, torch imported once, shared by every rank and every job) to
fork a process that only has to take over the actor's environment, join the process group and
run the user's code (milliseconds). The zygote outlives actor restarts, so a replaced actor
forks too.

The child process (`_zygote_child`, in this module so the zygote preloads it):

- takes the requesting actor's environment, `sys.path`, stdout and stderr (or the rank's log
  files, `ProcessSpec.output`, on descriptors 1 and 2), then sets the spec's
  variables (torchrun's: RANK, LOCAL_RANK, WORLD_SIZE, ...), changes to the working directory
  and puts it first on `sys.path`;
- installs a `WorkerContext` whose `Health` forwards `heartbeat()` and `report_error()` to the
  actor through a pipe, so the runtime SDK works unchanged inside training code;
- for a function entrypoint with `setup_process_group`, calls `init_process_group` from the
  environment (gloo on CPU, NCCL on CUDA) and destroys the group after a successful return;
- runs the entrypoint: a function call, or `runpy` for `script.py args` and `-m module args`
  (a torchrun command runs its script part) with `sys.argv` set as Python would;
- exits 0 on success, 1 on an exception (the traceback goes to the actor as a FAILURE event
  and to stderr), or the code of a `SystemExit`.

Processes are their own process group (so `terminate()` reaches the DataLoader workers they
fork), and that group is killed when the actor that started them dies (a pipe only the actor
holds reaches EOF).
"""

from __future__ import annotations

import atexit
import contextlib
import json
import multiprocessing.connection
import os
import runpy
import signal
import socket
import sys
import threading
import time
import traceback
import weakref
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any, cast

from dlu_api.spec.entrypoint import Entrypoint, EntrypointKind, parse_entrypoint
from dlu_api.spec.torchrun import parse_torchrun
from dlu_elastic.worker.warmup import PRELOAD
from dlu_prime import zygote
from dlu_prime.runtime.context import Health, WorkerContext, set_current_worker
from dlu_prime.worker.rank_logs import RankOutput, fds_for_child

BACKENDS = ("gloo", "nccl", "auto")
# Set by the launcher on every process it starts; also where `current_worker().device` reads.
DEVICE_ENV = "DLU_DEVICE"
_PG_ENV = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
_MAX_BUFFERED_EVENTS = 100_000


class EventKind(StrEnum):
    STARTED = "started"  # the child runs; message: its pid and whether torch was preloaded
    HEARTBEAT = "heartbeat"  # dlu_prime.runtime.heartbeat(step, metric) in training code
    ERROR_REPORT = "error_report"  # dlu_prime.runtime.report_error(message)
    FAILURE = "failure"  # the entrypoint raised or exited non-zero; message: the traceback


@dataclass(frozen=True)
class ProcessEvent:
    """One message from a training process, timestamped in the child."""

    kind: EventKind
    time: float
    step: int | None = None
    metric: float | None = None
    message: str | None = None


@dataclass
class ProcessSpec:
    """What one training process runs.

    `entrypoint`: 'module:function', 'module.function', 'script.py args...', '-m module args...',
    or a whole torchrun command (only its script part is used: DLU does the rendezvous).
    `env`: torchrun's variables (RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, GROUP_RANK,
    NODE_RANK, ROLE_RANK, ROLE_WORLD_SIZE, MASTER_ADDR, MASTER_PORT, TORCHELASTIC_RESTART_COUNT,
    TORCHELASTIC_MAX_RESTARTS, TORCHELASTIC_RUN_ID) and anything else; set over the environment
    the actor had when the launcher warmed up. DLU_JOB, DLU_ROLE, DLU_ACTOR and DLU_CONFIG_JSON
    feed `current_worker()`.
    `workdir`: the directory the process runs in and imports from; None: the caller's cwd at
    `start()`.
    `setup_process_group`: for function entrypoints, `init_process_group` from the environment
    before the call (scripts set up their own, as under torchrun).
    `backend`: "gloo", "nccl", or "auto" (NCCL when `device` is CUDA, gloo otherwise).
    `device`: "cpu", "cuda", "cuda:1"; exported as DLU_DEVICE (unless `env` sets it) and made
    the current CUDA device before an automatic NCCL process group.
    `output`: the rank's log files (opened for appending at each start); None: the process
    writes to the actor's stdout and stderr.
    """

    entrypoint: str
    env: dict[str, str] = field(default_factory=dict[str, str])
    workdir: str | None = None
    setup_process_group: bool = True
    backend: str = "auto"
    device: str = "cpu"
    pg_timeout_s: float = 300.0
    output: RankOutput | None = None

    def __post_init__(self) -> None:
        if self.backend not in BACKENDS:
            raise ValueError(f"backend {self.backend!r} is not one of {', '.join(BACKENDS)}")
        if not (self.device == "cpu" or self.device == "cuda" or self.device.startswith("cuda:")):
            raise ValueError(f"device {self.device!r} is not 'cpu', 'cuda' or 'cuda:N'")
        self.env = {str(k): str(v) for k, v in self.env.items()}

    def resolved_entrypoint(self) -> Entrypoint:
        """The entrypoint to run; a torchrun command becomes its script or module.

        Raises:
            ValueError: not an accepted entrypoint form, or a torchrun command DLU cannot run.
        """
        entry = parse_entrypoint(self.entrypoint)
        if entry.kind is EntrypointKind.TORCHRUN:
            entry = parse_entrypoint(parse_torchrun(entry.target).entrypoint)
        return entry

    def resolved_backend(self) -> str:
        if self.backend != "auto":
            return self.backend
        return "nccl" if self.device.startswith("cuda") else "gloo"


@dataclass(frozen=True)
class _ChildPayload:
    """What the child needs, resolved in the parent so that mistakes fail there."""

    kind: EntrypointKind
    target: str
    args: tuple[str, ...]
    env: dict[str, str]
    workdir: str
    setup_process_group: bool
    backend: str
    device: str
    pg_timeout_s: float


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
        self._exit_code: int | None = None
        self._exited = threading.Event()
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
        if event.kind is EventKind.FAILURE:
            self._last_failure = event.message
        with self._events_lock:
            self._events.append(event)

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
                    continue
                code = self._read_exit()
            while conn is not None and conn.poll(0):  # what it sent before exiting
                self._push(conn.recv())
        except (EOFError, OSError):
            pass
        finally:
            self._exit_code = code if code is not None else -signal.SIGKILL
            self._exited.set()
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
        fds = [writer.fileno(), alive_r, *std_fds]
        try:
            try:
                pid, status = zygote.fork(self._socket or self.prepare(), _zygote_child, args, fds)
            except zygote.ZygoteError:
                # The zygote may have exited (idle) or died since: start one and try once more.
                pid, status = zygote.fork(self.prepare(), _zygote_child, args, fds)
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

    def _payload(self, spec: ProcessSpec) -> _ChildPayload:
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
        return _ChildPayload(
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


# ---------------------------------------------------------------------------------------------
# The child side. Module-level functions, so the zygote can unpickle them by name.


class _PipeSink:
    """Sends events to the parent; never raises into training code."""

    def __init__(self, conn: Connection) -> None:
        self._conn = conn
        self._lock = threading.Lock()
        self._broken = False
        self._pid = os.getpid()

    def __call__(self, event: ProcessEvent) -> None:
        if self._broken or os.getpid() != self._pid:  # not from forked DataLoader workers
            return
        with self._lock:
            try:
                self._conn.send(event)
            except (OSError, ValueError):
                self._broken = True  # the parent is gone; the parent watch ends us soon


@dataclass
class ForwardingHealth(Health):
    """A `Health` that also sends every heartbeat and error report to a sink."""

    sink: Callable[[ProcessEvent], None] | None = None

    def beat(self, step: int | None, metric: float | None) -> None:
        super().beat(step, metric)
        if self.sink is not None:
            self.sink(ProcessEvent(EventKind.HEARTBEAT, time.time(), step=step, metric=metric))

    def report(self, message: str) -> None:
        super().report(message)
        if self.sink is not None:
            self.sink(ProcessEvent(EventKind.ERROR_REPORT, time.time(), message=message))


def _env_int(*names: str, default: int = 0) -> int:
    for name in names:
        value = os.environ.get(name)
        if value:
            try:
                return int(value)
            except ValueError:
                continue
    return default


def context_from_env(health: Health) -> WorkerContext:
    """The `WorkerContext` of a training process, from its environment."""
    config: dict[str, Any] = {}
    raw = os.environ.get("DLU_CONFIG_JSON")
    if raw:
        try:
            loaded = json.loads(raw)
        except ValueError:
            loaded = None
        if isinstance(loaded, dict):
            config = {str(k): v for k, v in cast(dict[Any, Any], loaded).items()}
    return WorkerContext(
        job=os.environ.get("DLU_JOB", ""),
        role=os.environ.get("DLU_ROLE", ""),
        rank=_env_int("ROLE_RANK", "RANK"),
        world_size=_env_int("ROLE_WORLD_SIZE", "WORLD_SIZE", default=1),
        local_rank=_env_int("LOCAL_RANK"),
        local_world_size=_env_int("LOCAL_WORLD_SIZE", default=1),
        node_rank=_env_int("GROUP_RANK", "NODE_RANK"),
        actor_name=os.environ.get("DLU_ACTOR", ""),
        config=config,
        health=health,
    )


def _zygote_child(
    payload: _ChildPayload,
    environ: dict[str, str],
    path: list[str],
    events_fd: int,
    alive_fd: int,
    stdout_fd: int,
    stderr_fd: int,
) -> int:
    """Entry of a training process in the zygote's fork: become the actor's process, run."""
    with contextlib.suppress(OSError):
        os.setpgid(0, 0)  # own group, for terminate()
    zygote.die_with_requester(alive_fd, "dlu-actor-watch")
    for fd, target in ((stdout_fd, 1), (stderr_fd, 2)):
        os.dup2(fd, target)
        os.close(fd)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    with contextlib.suppress(Exception):
        cast(Any, sys.stdout).reconfigure(line_buffering=True)
    os.environ.clear()
    os.environ.update(environ)
    sys.path[:] = path
    threads = os.environ.get("OMP_NUM_THREADS")
    if threads and threads.isdigit() and int(threads) > 0 and "torch" in sys.modules:
        sys.modules["torch"].set_num_threads(int(threads))  # the zygote imported torch without it
    return _child_main(payload, Connection(events_fd, readable=False))


def _child_main(payload: _ChildPayload, conn: Connection) -> int:
    """Run the training process's entrypoint; its exit code."""
    # Exit hooks registered in the zygote are not this process's; the ones the training code
    # registers run at the end, as in a fresh interpreter.
    atexit._clear()  # pyright: ignore[reportPrivateUsage]
    sink = _PipeSink(conn)
    sink(
        ProcessEvent(
            EventKind.STARTED,
            time.time(),
            message=f"pid {os.getpid()}, torch preloaded: {'torch' in sys.modules}",
        )
    )
    code = _run_child(payload, sink)
    # A fresh interpreter would run the atexit hooks (loggers, trackers); os._exit does not.
    with contextlib.suppress(Exception):
        atexit._run_exitfuncs()  # pyright: ignore[reportPrivateUsage]
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    conn.close()
    return code


def _run_child(payload: _ChildPayload, sink: _PipeSink) -> int:
    """Run the entrypoint; the exit code. Failures are printed and sent as FAILURE events."""
    try:
        os.environ.update(payload.env)
        os.chdir(payload.workdir)
        if payload.workdir in sys.path:
            sys.path.remove(payload.workdir)
        sys.path.insert(0, payload.workdir)  # first, as for `python -m` run there
        set_current_worker(context_from_env(ForwardingHealth(sink=sink)))
        if payload.kind is EntrypointKind.OBJECT:
            _run_object(payload)
        elif payload.kind is EntrypointKind.SCRIPT:
            script = Path(payload.target)
            if not script.is_absolute():
                script = Path(payload.workdir) / script
            sys.argv = [str(script), *payload.args]
            sys.path.insert(0, str(script.parent))  # as `python script.py` does
            runpy.run_path(str(script), run_name="__main__")
        else:
            sys.argv = [payload.target, *payload.args]  # runpy puts the module's file in argv[0]
            runpy.run_module(payload.target, run_name="__main__", alter_sys=True)
    except SystemExit as exc:
        code = _exit_code(exc)
        if code:
            text = f"exited with code {exc.code!r}\n{traceback.format_exc()}"
            sink(ProcessEvent(EventKind.FAILURE, time.time(), message=text))
        return code
    except BaseException:
        text = traceback.format_exc()
        with contextlib.suppress(Exception):
            sys.stderr.write(text)
        sink(ProcessEvent(EventKind.FAILURE, time.time(), message=text))
        return 1
    return 0


def _exit_code(exc: SystemExit) -> int:
    if exc.code is None:
        return 0
    if isinstance(exc.code, int):
        return exc.code
    with contextlib.suppress(Exception):
        sys.stderr.write(f"{exc.code}\n")  # as the interpreter prints sys.exit("message")
    return 1


def _run_object(payload: _ChildPayload) -> None:
    import inspect

    from dlu_prime.worker.entrypoint import resolve_object

    target = resolve_object(Entrypoint(EntrypointKind.OBJECT, payload.target))
    sys.argv = [payload.target]
    if not payload.setup_process_group:
        _call(target, inspect.isclass(target))
        return
    import datetime

    import torch
    import torch.distributed as dist

    if payload.backend == "nccl" and payload.device.startswith("cuda:"):
        torch.cuda.set_device(torch.device(payload.device))
    dist.init_process_group(
        backend=payload.backend,
        init_method="env://",
        timeout=datetime.timedelta(seconds=payload.pg_timeout_s),
    )
    _call(target, inspect.isclass(target))
    if dist.is_initialized():  # the user may have destroyed it already
        dist.destroy_process_group()


def _call(target: Any, is_class: bool) -> None:
    if is_class:
        instance = target()
        run = getattr(instance, "run", None)
        if not callable(run):
            raise TypeError(
                f"{type(instance).__name__} has no run() method; classes with only @rpc methods "
                "run inside the worker actor, not in a training process"
            )
        run()
    else:
        target()
