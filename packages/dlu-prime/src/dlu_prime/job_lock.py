"""One job name, one process: an OS lock per local job name, held by the process that runs it.

`dlu run` (and `Job.submit()` without an address) takes an exclusive `flock` on
`$DLU_HOME/jobs/<name>.lock` before anything starts and keeps it while the job runs. A second
run of the name is refused at once, naming the owner's pid. The kernel drops the lock when the
owner dies, however it dies (SIGKILL included), so a lock that nobody holds means no process
runs the job, whatever its last record says.

The lock file is never removed: unlinking it while another process waits to open it would let
two processes lock two different files of the same name. It holds the owner's pid, written
after the lock is taken, with the process's start time (`PID START`): a pid alone may have been
reused by an unrelated process since, so `dlu stop` signals only a process whose start time
matches (`verified_owner`).

Imports nothing heavy: `dlu run` takes the lock before it imports Ray or starts a zygote.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import time
from pathlib import Path

from dlu_api.errors import JobNameTakenError

_RETRY_S = 0.5  # a reader probing the lock holds it for microseconds: a taker retries that long
_PID_WAIT_S = 1.0  # how long a refused taker waits for the owner to write its pid


class JobLock:
    """The exclusive lock on one job name, held by this process until `release`."""

    def __init__(self, path: Path, fd: int) -> None:
        self.path = path
        self._fd: int | None = fd

    @classmethod
    def acquire(cls, path: Path, job: str) -> JobLock:
        """Take the lock or say who holds it.

        Raises:
            JobNameTakenError: another process (or another run in this one) holds it; the
                message names its pid and how to stop it.
        """
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        deadline = time.monotonic() + _RETRY_S
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() < deadline:
                    time.sleep(0.02)
                    continue
                os.close(fd)
                raise JobNameTakenError(taken_message(job, read_pid(path, _PID_WAIT_S))) from None
            except BaseException:
                os.close(fd)
                raise
        pid = os.getpid()
        line = f"{pid} {start_time(pid) or ''}".rstrip() + "\n"
        os.pwrite(fd, line.encode(), 0)  # over the last owner's line, never empty in between
        os.ftruncate(fd, len(line.encode()))
        return cls(path, fd)

    @property
    def held(self) -> bool:
        return self._fd is not None

    def release(self) -> None:
        """Give the name up (safe to call twice): its pid is erased, then closing the descriptor
        drops the lock. (An owner killed outright leaves its pid; the next owner overwrites it.)"""
        fd, self._fd = self._fd, None
        if fd is not None:
            with contextlib.suppress(OSError):
                os.ftruncate(fd, 0)  # no pid of a process that no longer owns it
            with contextlib.suppress(OSError):
                os.close(fd)


def taken_message(job: str, pid: int | None) -> str:
    where = f", in process {pid}" if pid else ""
    kill = f" (or `kill {pid}`)" if pid else ""
    return (
        f"job {job!r} is already running on this machine{where}. "
        f"Stop it with `dlu stop {job}`{kill}, or pick another name with --name."
    )


def start_time(pid: int) -> str | None:
    """When process `pid` started, in clock ticks since boot (Linux /proc); None where unknown.

    With the pid it names one process for good: a reused pid has a later start time."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text(encoding="ascii")
    except (OSError, UnicodeDecodeError):
        return None
    fields = stat.rpartition(")")[2].split()  # after the command name, which may hold spaces
    return fields[19] if len(fields) > 19 else None


def _read_owner(path: Path) -> tuple[int, str | None] | None:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError:
        return None
    parts = text.split("\n", 1)[0].split()
    if not parts or not parts[0].isdigit():
        return None
    return int(parts[0]), (parts[1] if len(parts) > 1 else None)


def read_pid(path: Path, wait_s: float = 0.0) -> int | None:
    """The pid the lock's owner wrote, waiting up to `wait_s` for it; None if there is none."""
    deadline = time.monotonic() + wait_s
    while True:
        found = _read_owner(path)
        if found is not None:
            return found[0]
        if time.monotonic() >= deadline:
            return None
        time.sleep(0.02)


def verified_owner(path: Path) -> int | None:
    """The pid of the process that holds the lock now, if it is that very process: the lock is
    held and the pid's start time is the one its owner wrote. None otherwise (nobody holds it,
    or the pid written is stale: its owner died and the pid may now be an unrelated process)."""
    if holder(path) in (None, 0):
        return None
    found = _read_owner(path)
    if found is None:
        return None
    pid, started = found
    now = start_time(pid)
    if started is None or now is None or now != started:
        return None
    return pid


def holder(path: Path) -> int | None:
    """The pid of the process holding the lock at `path`: 0 if one holds it but its pid is not
    written yet, None if nobody holds it (a probe: shares the lock for an instant)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return read_pid(path, _PID_WAIT_S) or 0
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)


# Taken by `dlu run` before it starts anything (dlu_api's connect), handed to the client that
# submits the job: path -> lock.
_reserved: dict[Path, JobLock] = {}


def reserve(path: Path, job: str) -> None:
    """Take the name's lock now, for the client of this process that submits the job next.

    Raises:
        JobNameTakenError: another process runs the job.
    """
    if path not in _reserved:
        _reserved[path] = JobLock.acquire(path, job)


def take(path: Path, job: str) -> JobLock:
    """The lock reserved in this process for `path`, else a newly acquired one.

    Raises:
        JobNameTakenError: another process, or another run in this one, holds it.
    """
    reserved = _reserved.pop(path, None)
    if reserved is not None and reserved.held:
        return reserved
    return JobLock.acquire(path, job)
