"""The embedded Ray's worker processes, forked from a zygote with Ray preloaded.

Every actor of a job is a Ray worker process, and the raylet starts each one as
`python default_worker.py ...`: `import ray` and DLU's actor modules cost 0.7 of the 0.9 s of
CPU a worker takes here to come up, and the raylet starts only as many at once as the node has
CPUs. A job's six actors took 2.4 s on two cores, and the role tier paid it again for the
actor Ray rebuilt. For the Ray it starts itself (`ray_env.init_local`) DLU gives the raylet
`ray_worker_entry.py` as its worker script instead: a small process that asks the node's Ray
zygote (`dlu_prime.zygote`, Ray and the actor modules imported once) for a child that runs
`default_worker.py` with the raylet's arguments, environment, working directory and standard
streams. Measured: the reference job's actors were placed 0.4 s after its PrimeMaster started
instead of 2.4 s.

The raylet knows the entry process, not the child: the entry stays alive as long as the child
(and exits with its code), passes SIGTERM and SIGINT on, and the child kills its own process
group when the entry dies (a SIGKILL from the raylet included). Anything that keeps the zygote
from forking (none can start, a preload fails) makes the entry run `default_worker.py` itself:
the worker starts as slowly as Ray's own, never not at all. `DLU_RAY_WORKER_ZYGOTE=0` turns
the zygote off.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import runpy
import signal
import socket
import sys
from pathlib import Path

from dlu_prime import ray_private, zygote
from dlu_prime.actor_paths import ACTOR_MODULES

ENABLE_ENV = "DLU_RAY_WORKER_ZYGOTE"
ENTRY_SCRIPT = str(Path(__file__).with_name("ray_worker_entry.py"))
ENTRY_ENV = "DLU_RAY_WORKER_ENTRY"  # in a forked worker: the pid of the process the raylet started
PRELOAD: tuple[str, ...] = ("ray", ray_private.DEFAULT_WORKER_MODULE, *ACTOR_MODULES, __name__)


def enabled() -> bool:
    return os.environ.get(ENABLE_ENV, "1").strip().lower() not in ("0", "false", "no", "off")


def ray_worker_script() -> str:
    """Ray's own worker script, found without importing Ray (the head that runs this entry put
    it in the environment)."""
    script = os.environ.get(ray_private.DEFAULT_WORKER_ENV) or ray_private.default_worker_script()
    if script is None:
        raise zygote.ZygoteError("Ray's worker script is not where DLU looks for it")
    return script


# The job a worker is started for. Ray's C++ core reads it once, when Ray is imported: the zygote
# imports Ray with the nil job, as the workers a new Ray starts before any job have, and which
# Ray itself hands to any job's actors.
JOB_ENV = ray_private.JOB_ENV
NIL_JOB = ray_private.NIL_JOB
IDLE_S = 30.0  # a Ray zygote serves one Ray session: it need not outlive it long


def _environment_salt(environ: dict[str, str]) -> str:
    """Ray's C++ core reads its other RAY_* settings once too (the raylet's pid among them): a
    zygote serves only workers started with the same settings, i.e. those of one raylet."""
    settings = sorted((k, v) for k, v in environ.items() if k.startswith("RAY_") and k != JOB_ENV)
    return hashlib.sha256(repr(settings).encode()).hexdigest()[:16]


def main(argv: list[str]) -> None:
    """The raylet's worker script: run Ray's worker in a child of the Ray zygote; exits with it."""
    script = ray_worker_script()
    environ = dict(os.environ)  # the worker's, from the raylet
    try:
        if not enabled():
            raise zygote.ZygoteError(f"{ENABLE_ENV} is off")
        os.environ[JOB_ENV] = NIL_JOB  # what a zygote this process starts imports Ray with
        path = zygote.ensure_started(PRELOAD, idle_s=IDLE_S, salt=_environment_salt(environ))
        entry_alive_r, _entry_alive_w = os.pipe()  # open while this process lives: the child dies with it
        child_alive_r, child_alive_w = os.pipe()  # this process learns when the child is gone
        pid, conn = zygote.fork(
            path,
            run_worker,
            (script, argv, {**environ, ENTRY_ENV: str(os.getpid())}, os.getcwd()),
            [entry_alive_r, child_alive_w, 0, 1, 2],
        )
    except (zygote.ZygoteError, OSError) as exc:
        print(f"dlu: starting this Ray worker without the zygote: {exc}", file=sys.stderr, flush=True)
        os.execve(sys.executable, [sys.executable, script, *argv], environ)
    os.close(entry_alive_r)
    os.close(child_alive_w)
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda sig, _frame: _forward(pid, sig))
    sys.exit(_wait_child(conn, child_alive_r))


def _forward(pid: int, signum: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signum)


def _wait_child(conn: socket.socket, child_alive_r: int) -> int:
    """The child's exit code from the zygote; if the zygote went first, wait for the child's end."""
    try:
        answer, _ = zygote.recv_message(conn)
    except (OSError, EOFError, zygote.ZygoteError):
        answer = None
    if answer is not None and "exit" in answer:
        return int(answer["exit"])
    with contextlib.suppress(OSError):
        while os.read(child_alive_r, 1):
            pass
    return 1


def run_worker(
    script: str,
    argv: list[str],
    environ: dict[str, str],
    cwd: str,
    entry_alive_fd: int,
    child_alive_fd: int,
    stdin_fd: int,
    stdout_fd: int,
    stderr_fd: int,
) -> int:
    """In the zygote's child: become the process the raylet meant to start, then run Ray's worker.

    `child_alive_fd` stays open (and is not inherited by what this process execs) until it exits.
    """
    os.setpgid(0, 0)  # a group of its own: nothing that ends this worker's group reaches the zygote
    os.set_inheritable(entry_alive_fd, False)  # what the worker starts must not hold either pipe
    os.set_inheritable(child_alive_fd, False)
    for fd, target in ((stdin_fd, 0), (stdout_fd, 1), (stderr_fd, 2)):
        os.dup2(fd, target)
        os.close(fd)
    os.chdir(cwd)
    os.environ.clear()
    os.environ.update(environ)
    zygote.die_with_requester(entry_alive_fd, "dlu-entry-watch")
    sys.argv = [script, *argv]
    sys.path.insert(0, str(Path(script).parent))
    runpy.run_path(script, run_name="__main__")
    return 0
