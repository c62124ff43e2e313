"""Nothing of an embedded Ray outlives the process that started it, however that process ends.

Ray ties most of a local head to its starter: the GCS, the raylet and the log monitor get
PR_SET_PDEATHSIG (SIGKILL when the starter dies), and the raylet's workers exit when the raylet
does. Its agents (dashboard agent, runtime-env agent) notice the raylet's death too, within
2 s, but then try for 60 s to report it to the GCS, which is gone as well: after a SIGKILL of
`dlu run` they linger a minute (seen on Ray 2.60).

So while Ray starts, the starter carries a marker in its environment, which every process that
Ray starts inherits (the raylet's agents and workers from the raylet), and it starts a watcher:
a tiny process in a session of its own that waits for its parent, the starter, to end (a pidfd;
no descriptor of the starter's is involved, so nothing the starter forks can hold it up). When
the starter is gone (an exit, an exception, SIGKILL alike) the watcher SIGKILLs every process
still carrying the marker, then exits. The node's zygotes are left to their idle exit (they
are shared daemons); what they forked for this Ray dies with the processes that asked for it
(see dlu_prime.zygote.die_with_requester).

The marker is read from /proc/PID/environ, the environment a process started with. Ray names
its processes with setproctitle, which may write the new name over that memory (it borrows the
environment's space after the arguments'), wiping the marker of some of them (seen: the agents,
depending on where the marker fell); SPT_NOENV=1 makes it keep to the arguments' space, so it is
set alongside the marker.

Both are set only while `ray.init` runs, so processes the starter creates later for itself do
not carry them. Linux only (it reads /proc); elsewhere nothing is watched. Because of it, `dlu
run` exits once its job's end is recorded without shutting its Ray down first (`watching()`,
`LocalJobClient.close_at_exit`).
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Generator
from contextlib import contextmanager, suppress
from pathlib import Path

MARKER_ENV = "DLU_RAY_OWNER"
_KEEP_ENVIRON = "SPT_NOENV"  # setproctitle: do not write process names over the environment
_ZYGOTE = b"dlu_prime.zygote"  # in the command line of a zygote and of its spares
_PASSES = 3  # a process starting while the watcher kills still carries the marker: look again

_marker: str | None = None  # this process's, once its watcher runs
_watcher: subprocess.Popen[bytes] | None = None  # kept: it outlives this process on purpose


@contextmanager
def marked() -> Generator[None]:
    """While the block runs (Ray starting), children of this process carry this process's
    marker; the watcher is started on first use."""
    if not Path("/proc/self/environ").exists():
        yield
        return
    settings = {MARKER_ENV: _start_watcher(), _KEEP_ENVIRON: "1"}
    previous = {name: os.environ.get(name) for name in settings}
    os.environ.update(settings)
    try:
        yield
    finally:
        for name, value in previous.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def _start_watcher() -> str:
    global _marker, _watcher
    if _marker is not None:
        return _marker
    marker = uuid.uuid4().hex
    _watcher = subprocess.Popen(
        [sys.executable, "-S", __file__, marker, str(os.getpid())],
        env={k: v for k, v in os.environ.items() if k != MARKER_ENV},
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,  # a terminal's Ctrl-C or hangup does not reach it
    )
    _marker = marker
    return marker


def watching() -> bool:
    """Whether this process's watcher runs: then nothing the marked Rays started outlives this
    process, whether or not it shuts them down itself."""
    return _watcher is not None and _watcher.poll() is None


def marked_processes(marker: str) -> list[int]:
    """Pids of the processes carrying `marker` in their environment, zygotes left out."""
    needle = f"{MARKER_ENV}={marker}".encode()
    found: list[int] = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            environ = (entry / "environ").read_bytes()
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue  # gone, or not ours to read
        if needle in environ.split(b"\0") and _ZYGOTE not in cmdline:
            found.append(int(entry.name))
    return found


def wait_for_parent_exit(parent: int) -> None:
    """Return once `parent`, the process that started this one, has ended."""
    try:
        pidfd: int | None = os.pidfd_open(parent)
    except (AttributeError, OSError):  # no pidfd (kernel < 5.3, a sandbox): poll instead
        pidfd = None
    # Still our parent now: then it was alive when the pidfd was opened, so the pidfd is its.
    if os.getppid() != parent:
        return
    if pidfd is not None:
        select.select([pidfd], [], [])  # readable once the process has ended
        return
    while os.getppid() == parent:
        time.sleep(0.2)


def watch(marker: str, parent: int) -> None:
    """The watcher: wait for the starter to end, then kill what carries its marker."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    wait_for_parent_exit(parent)
    for attempt in range(_PASSES):
        for pid in marked_processes(marker):
            with suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        if attempt + 1 < _PASSES:
            time.sleep(0.2)


if __name__ == "__main__":
    watch(sys.argv[1], int(sys.argv[2]))
