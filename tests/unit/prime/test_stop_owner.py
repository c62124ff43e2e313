"""`dlu stop` signals only a process verified as the job's owner: the name's lock is held and
the pid written in it has the start time its owner wrote (a pid alone may have been reused)."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from dlu_api.errors import JobNotFoundError
from dlu_api.status import JobStage, JobStatus
from dlu_prime import job_lock
from dlu_prime.job_files import JobFiles

pytestmark = pytest.mark.timeout(60)

JOB = "lm"
SLEEP = [sys.executable, "-c", "import time; time.sleep(60)"]
# Holds the name's lock without writing its pid: the moment between a new owner's flock and its
# write, when the file still names the last owner, or a pid reused since.
BARE_HOLDER = (
    "import fcntl, os, sys, time\n"
    "fd = os.open(sys.argv[1], os.O_RDWR)\n"
    "fcntl.flock(fd, fcntl.LOCK_EX)\n"
    "print('held', flush=True)\n"
    "time.sleep(60)\n"
)
# Stands in for `dlu run`, which takes SIGINT back even when started with it ignored (a
# background job of a non-interactive shell, as a suite run from such a shell starts this).
OWNER = (
    "import signal, sys, time\n"
    "signal.signal(signal.SIGINT, signal.default_int_handler)\n"
    "from pathlib import Path\n"
    "from dlu_prime.job_lock import JobLock\n"
    "lock = JobLock.acquire(Path(sys.argv[1]), 'lm')\n"
    "print('held', flush=True)\n"
    "time.sleep(60)\n"
)


def _start(code: str, path: Path) -> subprocess.Popen[str]:
    proc = subprocess.Popen([sys.executable, "-c", code, str(path)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
    return proc


@pytest.fixture
def files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> JobFiles:
    monkeypatch.setenv("DLU_HOME", str(tmp_path))
    found = JobFiles(tmp_path)
    found.root.mkdir(parents=True)
    found.write(JobStatus(name=JOB, stage=JobStage.RUNNING), None)
    return found


@pytest.fixture
def bystander() -> Iterator[subprocess.Popen[bytes]]:
    proc = subprocess.Popen(SLEEP)
    yield proc
    proc.kill()
    proc.wait(30)


def test_start_time_names_one_process(bystander: subprocess.Popen[bytes]) -> None:
    started = job_lock.start_time(bystander.pid)
    assert started is not None and started == job_lock.start_time(bystander.pid)
    assert job_lock.start_time(2**22 + 7) is None  # above Linux's pid limit: no such process


def test_a_stale_pid_of_a_live_unrelated_process_is_not_signalled(
    files: JobFiles, bystander: subprocess.Popen[bytes]
) -> None:
    from dlu_prime.local import LocalJobClient

    path = files.lock_path(JOB)
    path.write_text(f"{bystander.pid} 1\n")  # a pid the last owner wrote, reused since
    holder = _start(BARE_HOLDER, path)
    try:
        assert job_lock.verified_owner(path) is None
        with pytest.raises(JobNotFoundError, match="could not be verified as its owner"):
            LocalJobClient().stop(JOB)
        assert bystander.poll() is None  # not signalled
        assert holder.poll() is None
    finally:
        holder.kill()
        holder.wait(30)


def test_a_verified_owner_is_signalled(files: JobFiles) -> None:
    from dlu_prime.local import LocalJobClient

    path = files.lock_path(JOB)
    owner = _start(OWNER, path)
    try:
        assert job_lock.verified_owner(path) == owner.pid
        LocalJobClient().stop(JOB)  # SIGINT: the owner's Python ends with KeyboardInterrupt
        assert owner.wait(30) != 0
    finally:
        owner.kill()
        owner.wait(30)


def test_delete_removes_a_stopped_record_and_refuses_a_running_job(files: JobFiles) -> None:
    from dlu_api.errors import JobRunningError
    from dlu_prime.local import LocalJobClient

    owner = _start(OWNER, files.lock_path(JOB))
    try:
        with pytest.raises(JobRunningError, match="stop it first"):
            LocalJobClient().delete(JOB)
        assert files.path(JOB).is_file()
    finally:
        owner.kill()
        owner.wait(30)
    files.write(JobStatus(name=JOB, stage=JobStage.STOPPED, exit_code=0), None)
    LocalJobClient().delete(JOB)
    assert not files.path(JOB).exists()
    with pytest.raises(JobNotFoundError):
        LocalJobClient().delete(JOB)


def test_a_stop_while_stopping_is_a_second_ctrl_c(files: JobFiles, monkeypatch: pytest.MonkeyPatch) -> None:
    """No mailbox request then: SIGINT at once, as a second Ctrl-C."""
    from dlu_prime.local import LocalJobClient

    def no_request(*args: object, **kwargs: object) -> None:
        raise AssertionError("a stop while STOPPING asked the mailbox")

    owner = _start(OWNER, files.lock_path(JOB))
    try:
        record = {
            "status": JobStatus(name=JOB, stage=JobStage.STOPPING).model_dump(mode="json"),
            "pid": owner.pid,
        }
        files.path(JOB).write_text(json.dumps(record))
        assert files.status(JOB)[0].stage is JobStage.STOPPING
        monkeypatch.setattr(JobFiles, "ask", no_request)
        LocalJobClient().stop(JOB)
        assert owner.wait(30) != 0
    finally:
        owner.kill()
        owner.wait(30)
