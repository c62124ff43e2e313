"""One job name, one process: the name lock and what a local job's record means.

The lock is held by real processes here and released by killing them with SIGKILL, as the
kernel would release it for a `dlu run` that was killed.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from dlu_api.errors import JobNameTakenError, JobNotFoundError
from dlu_api.status import ActorStatus, JobStage, JobStatus, RoleStatus
from dlu_prime import job_lock
from dlu_prime.job_files import JobFiles, current_status, ended_roles

pytestmark = pytest.mark.timeout(60)

JOB = "lm"

# A process that takes the lock, then (optionally) starts a child of its own that must not
# inherit it, says so on stdout, and waits to be killed.
HOLDER = """
import subprocess, sys, time
from pathlib import Path
from dlu_prime.job_lock import JobLock
lock = JobLock.acquire(Path(sys.argv[1]), "lm")
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"]) if sys.argv[2] == "child" else None
print(child.pid if child else 0, flush=True)
time.sleep(120)
"""


class Holder:
    def __init__(self, path: Path, with_child: bool = False) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", HOLDER, str(path), "child" if with_child else "none"],
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stdout is not None
        self.child = int(self.proc.stdout.readline())

    @property
    def pid(self) -> int:
        return self.proc.pid

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(30)

    def end(self) -> None:
        if self.proc.poll() is None:
            self.kill()
        if self.child:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.child, signal.SIGKILL)


@pytest.fixture
def files(tmp_path: Path) -> JobFiles:
    return JobFiles(tmp_path)


@pytest.fixture
def holder(files: JobFiles) -> Iterator[Holder]:
    held = Holder(files.lock_path(JOB))
    yield held
    held.end()


def running(pid: int) -> dict[str, object]:
    roles = [
        RoleStatus(
            name="worker",
            kind="simple",
            actors=[
                ActorStatus(name="w-0", role="worker", rank=0, stage="RUNNING"),
                ActorStatus(name="w-1", role="worker", rank=1, stage="FAILED"),
            ],
        )
    ]
    status = JobStatus(name=JOB, stage=JobStage.RUNNING, roles=roles)
    return {"status": status.model_dump(mode="json"), "ray_address": None, "pid": pid}


def write_record(files: JobFiles, record: dict[str, object]) -> None:
    files.root.mkdir(parents=True, exist_ok=True)
    files.path(JOB).write_text(json.dumps(record))


def test_a_second_taker_is_refused_with_the_owners_pid_and_how_to_stop_it(
    files: JobFiles, holder: Holder
) -> None:
    with pytest.raises(JobNameTakenError) as refused:
        job_lock.JobLock.acquire(files.lock_path(JOB), JOB)
    message = str(refused.value)
    assert f"process {holder.pid}" in message
    assert f"dlu stop {JOB}" in message and f"kill {holder.pid}" in message
    assert job_lock.holder(files.lock_path(JOB)) == holder.pid


def test_the_owner_killed_outright_frees_the_name_and_its_record_reads_lost(
    files: JobFiles, holder: Holder
) -> None:
    write_record(files, running(holder.pid))
    status, owner = files.status(JOB)
    assert (status.stage, owner) == (JobStage.RUNNING, holder.pid)

    holder.kill()

    status, owner = files.status(JOB)
    assert owner is None
    assert status.stage is JobStage.LOST and status.stage.is_terminal and status.finished
    assert f"process {holder.pid}" in status.reason and "last seen RUNNING" in status.reason
    # no actor is listed as running in a job nobody runs; one that had failed stays FAILED
    assert [a.stage for a in status.roles[0].actors] == ["LOST", "FAILED"]
    # and the name can be taken again
    again = job_lock.JobLock.acquire(files.lock_path(JOB), JOB)
    assert job_lock.holder(files.lock_path(JOB)) == os.getpid()
    again.release()


def test_the_lock_is_not_inherited_by_the_owners_children(files: JobFiles) -> None:
    """A child the owner started (a Ray process, a zygote) that outlives it must not keep the name."""
    held = Holder(files.lock_path(JOB), with_child=True)
    try:
        held.kill()
        os.kill(held.child, 0)  # the child lives on
        assert job_lock.holder(files.lock_path(JOB)) is None
        job_lock.JobLock.acquire(files.lock_path(JOB), JOB).release()
    finally:
        held.end()


def test_release_frees_the_name_and_erases_the_pid(files: JobFiles) -> None:
    lock = job_lock.JobLock.acquire(files.lock_path(JOB), JOB)
    assert files.lock_path(JOB).read_text().split()[0] == str(os.getpid())
    # a second run in the same process is refused too
    with pytest.raises(JobNameTakenError, match=f"process {os.getpid()}"):
        job_lock.JobLock.acquire(files.lock_path(JOB), JOB)
    lock.release()
    lock.release()  # twice is harmless
    assert files.lock_path(JOB).read_text() == ""
    assert job_lock.holder(files.lock_path(JOB)) is None
    job_lock.JobLock.acquire(files.lock_path(JOB), JOB).release()


def test_a_reserved_name_is_handed_to_the_submitting_client(files: JobFiles) -> None:
    path = files.lock_path(JOB)
    job_lock.reserve(path, JOB)
    job_lock.reserve(path, JOB)  # reserving again keeps the one lock
    lock = job_lock.take(path, JOB)
    assert lock.held and job_lock.holder(path) == os.getpid()
    with pytest.raises(JobNameTakenError):
        job_lock.take(path, JOB)  # nothing reserved any more, and the name is taken
    lock.release()
    fresh = job_lock.take(path, JOB)
    fresh.release()


def test_a_probe_does_not_make_a_taker_fail(files: JobFiles) -> None:
    """Readers probe the lock by sharing it for an instant; a taker retries past that."""
    path = files.lock_path(JOB)
    path.parent.mkdir(parents=True, exist_ok=True)
    probe = os.open(path, os.O_RDONLY | os.O_CREAT)
    fcntl.flock(probe, fcntl.LOCK_SH)
    timer = threading.Timer(0.05, os.close, (probe,))
    timer.start()
    try:
        job_lock.JobLock.acquire(path, JOB).release()
    finally:
        timer.join()


def test_a_finished_record_stays_as_written_when_nobody_holds_the_name(files: JobFiles) -> None:
    stopped = JobStatus(name=JOB, stage=JobStage.STOPPED, exit_code=0, reason="finished")
    write_record(files, {"status": stopped.model_dump(mode="json"), "pid": 1})
    assert files.status(JOB) == (stopped, None)


def test_a_record_without_a_lock_file_reads_lost(files: JobFiles) -> None:
    """Records of runs before names were locked (or a lock file removed by hand)."""
    write_record(files, running(12345))
    status, owner = files.status(JOB)
    assert status.stage is JobStage.LOST and owner is None


def test_unknown_job(files: JobFiles) -> None:
    with pytest.raises(JobNotFoundError, match="dlu list"):
        files.status("ghost")


@pytest.mark.parametrize(
    ("owner", "stage", "reason"),
    [
        (None, JobStage.LOST, "process 7 that ran this job is gone"),
        (7, JobStage.RUNNING, ""),  # the writer holds the name: current
        (0, JobStage.RUNNING, ""),  # held, pid not written yet: the record stands
        (9, JobStage.INIT, "process 9 is starting it"),  # a new run, not written yet
    ],
)
def test_current_status(owner: int | None, stage: JobStage, reason: str) -> None:
    recorded = JobStatus(name=JOB, stage=JobStage.RUNNING)
    now = current_status(recorded, 7, owner)
    assert now.stage is stage
    assert reason in now.reason


def test_ended_roles_leaves_finished_actors_alone() -> None:
    role = RoleStatus(
        name="r",
        kind="simple",
        actors=[
            ActorStatus(name=f"a-{i}", role="r", rank=i, stage=stage)
            for i, stage in enumerate(["RUNNING", "READY", "FINISH", "FAILED", "STOPPED", "INIT"])
        ],
    )
    (ended,) = ended_roles([role], "STOPPED")
    assert [a.stage for a in ended.actors] == ["STOPPED", "STOPPED", "FINISH", "FAILED", "STOPPED", "STOPPED"]


def test_stopping_a_lost_job_signals_nobody(files: JobFiles, monkeypatch: pytest.MonkeyPatch) -> None:
    """The record's pid may belong to an unrelated process by now: `dlu stop` must not touch it."""
    from dlu_prime.local import LocalJobClient

    bystander = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        write_record(files, running(bystander.pid))
        monkeypatch.setenv("DLU_HOME", str(files.root.parent))
        client = LocalJobClient()
        with pytest.raises(JobNotFoundError, match=r"is not running \(LOST\)"):
            client.stop(JOB)
        summary = client.list_jobs()
        assert [(s.name, s.stage) for s in summary] == [(JOB, JobStage.LOST)]
        time.sleep(0.2)
        assert bystander.poll() is None  # not signalled
        assert files.path(JOB).is_file()  # the record is kept: `dlu status` still explains
    finally:
        bystander.kill()
        bystander.wait(30)


SUBMIT = """
import json, sys
from dlu_api.errors import JobNameTakenError
from dlu_api.spec import spec_from_dict
from dlu_prime.local import LocalJobClient
role = {"name": "w", "entrypoint": "json:dumps", "resources": {"cpu": 0.1}}
spec = spec_from_dict({"name": "lm", "device_type": "CPU", "device_per_node": 0, "roles": [role]})
try:
    LocalJobClient().submit(spec)
    refused = ""
except JobNameTakenError as exc:
    refused = str(exc)
import ray
print(json.dumps({"refused": refused, "ray": ray.is_initialized()}))
"""


def test_the_python_client_is_refused_before_ray_starts(files: JobFiles, holder: Holder) -> None:
    """`Job(spec).submit()` without an address: the same refusal, and no embedded Ray (in a
    fresh interpreter: another test may have started a Ray in this one)."""
    env = {**os.environ, "DLU_HOME": str(files.root.parent)}
    done = subprocess.run(
        [sys.executable, "-c", SUBMIT], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.splitlines()[-1])
    assert f"in process {holder.pid}" in result["refused"]
    assert result["ray"] is False
