"""The child side of a training process: what runs in the zygote's fork.

`zygote_child` is the function the zygote calls in a forked child (module-level functions and
classes, so the zygote can unpickle them by name; `process` imports this module, so the zygote
that preloads `dlu_elastic.worker.process` has it imported before any fork). The child:

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
  and to stderr), or the code of a `SystemExit`; where the rank wrote torchrun's error file
  (`@record`), the FAILURE event carries what it wrote instead (see error_file.py).
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import runpy
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any, cast

from dlu_api.spec.entrypoint import Entrypoint, EntrypointKind
from dlu_elastic.worker.error_file import failure_text
from dlu_elastic.worker.process_types import PASSED_FDS_ENV, ProcessEvent, ProcessEventKind
from dlu_prime import zygote
from dlu_prime.runtime.context import Health, WorkerContext, set_current_worker


@dataclass(frozen=True)
class ChildPayload:
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
            self.sink(ProcessEvent(ProcessEventKind.HEARTBEAT, time.time(), step=step, metric=metric))

    def report(self, message: str) -> None:
        super().report(message)
        if self.sink is not None:
            self.sink(ProcessEvent(ProcessEventKind.ERROR_REPORT, time.time(), message=message))


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


def zygote_child(
    payload: ChildPayload,
    environ: dict[str, str],
    path: list[str],
    events_fd: int,
    alive_fd: int,
    stdout_fd: int,
    stderr_fd: int,
    *passed_fds: int,
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
    os.environ.pop(PASSED_FDS_ENV, None)  # the actor's own, if it was started this way
    if passed_fds:
        os.environ[PASSED_FDS_ENV] = ",".join(str(fd) for fd in passed_fds)
    sys.path[:] = path
    threads = os.environ.get("OMP_NUM_THREADS")
    if threads and threads.isdigit() and int(threads) > 0 and "torch" in sys.modules:
        sys.modules["torch"].set_num_threads(int(threads))  # the zygote imported torch without it
    return _child_main(payload, Connection(events_fd, readable=False))


def _child_main(payload: ChildPayload, conn: Connection) -> int:
    """Run the training process's entrypoint; its exit code."""
    # Exit hooks registered in the zygote are not this process's; the ones the training code
    # registers run at the end, as in a fresh interpreter.
    atexit._clear()  # pyright: ignore[reportPrivateUsage]
    sink = _PipeSink(conn)
    sink(
        ProcessEvent(
            ProcessEventKind.STARTED,
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


def _run_child(payload: ChildPayload, sink: _PipeSink) -> int:
    """Run the entrypoint; the exit code. Failures are printed and sent as FAILURE events."""
    try:
        os.environ.update(payload.env)
        # The zygote's imports (torch's) cached its own TMPDIR; read this process's, as a fresh
        # interpreter would (the zygote outlives its starter, and the starter's folder with it).
        tempfile.tempdir = None
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
            text = failure_text(f"exited with code {exc.code!r}\n{traceback.format_exc()}")
            sink(ProcessEvent(ProcessEventKind.FAILURE, time.time(), message=text, exit_code=code))
        return code
    except BaseException:
        text = traceback.format_exc()
        with contextlib.suppress(Exception):
            sys.stderr.write(text)
        sink(ProcessEvent(ProcessEventKind.FAILURE, time.time(), message=failure_text(text), exit_code=1))
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


def _run_object(payload: ChildPayload) -> None:
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
