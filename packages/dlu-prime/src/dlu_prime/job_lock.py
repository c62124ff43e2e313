"""One job name, one process: an OS lock per local job name, held by the process that runs it.

`dlu run` (and `Job.submit()` without an address) takes an exclusive `flock` on
`$DLU_HOME/jobs/<name>.lock` before anything starts and keeps it while the job runs. A second
run of the name is refused at once, naming the owner's pid. The kernel drops the lock when the
owner dies, however it dies (SIGKILL included), so a lock that nobody holds means no process
runs the job, whatever its last record says.

The lock file is never removed: unlinking it while another process waits to open it would let
two processes lock two different files of the same name. It holds the owner's pid, written
after the lock is taken (a reader may briefly find it empty).

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
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
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


def read_pid(path: Path, wait_s: float = 0.0) -> int | None:
    """The pid the lock's owner wrote, waiting up to `wait_s` for it; None if there is none."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            text = path.read_text(encoding="utf-8").strip()
        except OSError:
            text = ""
        if text.isdigit():
            return int(text)
        if time.monotonic() >= deadline:
            return None
        time.sleep(0.02)


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
