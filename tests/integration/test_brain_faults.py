"""Brain faults injected for real: the Brain process SIGKILLed while a job reports (statistics
buffered in the job, nothing lost, a restarted Brain resumes its administrators from the
database), SIGKILLed after the job applied a plan and before it sent a speed at the new size (the
restarted Brain plans from the applied size), and the PostgreSQL server stopped and started again
under a running Brain."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from dlu_brain.db import BrainDatabase
from dlu_brain.testing.postgres import PostgresServer, PostgresUnavailable
from dlu_prime.brain_port import BrainClient, BrainMode, JobRegistration, PlanOutcome, RoleShape, StatSample

pytestmark = [pytest.mark.timeout(240), pytest.mark.slow]


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class BrainProcess:
    def __init__(self, db_url: str, port: int, log: Path) -> None:
        self.db_url, self.port, self.log = db_url, port, log
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        """Start and wait until this start (not an earlier one in the same log) serves."""
        serving = rf"Brain serving at http://127.0.0.1:{self.port}"
        before = len(re.findall(serving, self.log.read_text(errors="replace"))) if self.log.exists() else 0
        out = open(self.log, "ab")  # noqa: SIM115 - the child writes it
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "dlu_brain", "--db", self.db_url, "--port", str(self.port)],
            stdout=out, stderr=out,
        )  # fmt: skip
        out.close()
        deadline = time.monotonic() + 60
        while len(re.findall(serving, self.log.read_text(errors="replace"))) <= before:
            assert self.proc.poll() is None, self.log.read_text()
            assert time.monotonic() < deadline, self.log.read_text()
            time.sleep(0.1)

    def kill(self) -> None:
        assert self.proc is not None
        os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=30)

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=30)


def registration(max_size: int = 4) -> JobRegistration:
    shape = RoleShape(kind="elastic", size=2, min_size=1, max_size=max_size, elastic=True)
    return JobRegistration(
        name="lm", run_id="run-1", roles={"trainer": shape}, entrypoint="t:m", config_hash="h"
    )


def batch(start: int, n: int) -> list[StatSample]:
    return [StatSample(time=float(i), kind="throughput", role="trainer", world_size=2, samples_per_s=100.0)
            for i in range(start, start + n)]  # fmt: skip


def wait_flushed(client: BrainClient) -> None:
    deadline = time.monotonic() + 60
    while client.buffered or client.mode is not BrainMode.CLUSTER:
        assert time.monotonic() < deadline, (client.buffered, client.last_error)
        client.report([])
        time.sleep(0.1)


@pytest.fixture
def brain_db(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'brain.sqlite'}"


def test_brain_killed_statistics_buffered_and_resumed(tmp_path: Path, brain_db: str) -> None:
    brain = BrainProcess(brain_db, free_port(), tmp_path / "brain.log")
    brain.start()
    client = BrainClient(f"http://127.0.0.1:{brain.port}", retry_min_s=0.05, retry_max_s=0.2, timeout_s=2)
    try:
        client.job_started(registration())
        client.report(batch(0, 5))
        assert client.mode is BrainMode.CLUSTER and client.buffered == 0
        brain.kill()
        client.report(batch(5, 20))  # the job goes on: nothing raised, all kept
        assert client.mode is BrainMode.SINGLE_JOB
        client.report(batch(25, 20))  # reported while in single-job mode: kept too
        assert client.buffered == 40
        assert client.plan() is None
        brain.start()  # same database, same port: the administrator is taken back
        wait_flushed(client)
        plan = client.plan()
        assert plan is not None and plan.job == "lm"
    finally:
        client.close()
        brain.stop()
    db = BrainDatabase(brain_db)
    job = db.find_job("lm", "run-1")
    assert job is not None
    assert len(db.samples(job.id)) == 45 and client.dropped == 0
    assert "resumed 1 administrators" in (tmp_path / "brain.log").read_text()
    db.close()


COMM = {n: 100.0 / (1.0 / n + 0.02 * n) for n in range(1, 9)}  # 2 -> 3 keeps 75% of linear, 3 -> 4 58%


def speeds_at(size: int) -> list[StatSample]:
    return [StatSample(time=float(i), kind="throughput", role="trainer", world_size=size,
                       samples_per_s=COMM[size]) for i in range(3)]  # fmt: skip


def test_brain_killed_after_a_plan_is_applied_plans_from_the_applied_size(
    tmp_path: Path, brain_db: str
) -> None:
    """The job measures 2 and 3 nodes and applies the Brain's 2 -> 3 and 3 -> 4; the Brain is
    killed before any speed at 4 nodes arrives. Its last sample says 3 nodes: the restarted Brain
    must know the job runs at 4, plan 4 -> 5 once 4 is measured, and never issue 3 -> 4 again."""
    brain = BrainProcess(brain_db, free_port(), tmp_path / "brain.log")
    brain.start()
    url = f"http://127.0.0.1:{brain.port}"
    client = BrainClient(url, retry_min_s=0.05, retry_max_s=0.2, timeout_s=5)
    try:
        client.job_started(registration(max_size=8))
        for size in (2, 3):
            client.report(speeds_at(size))
            answer = client.plan()
            assert answer is not None, client.last_error
            (plan,) = answer.roles
            assert plan.size == size + 1 and plan.id is not None, plan.reason
            client.plan_outcome(PlanOutcome(run_id="run-1", plan_id=plan.id, state="applied"))
        assert client.plan() is not None  # everything delivered, the answer to 3 -> 4 too
        brain.kill()
        db = BrainDatabase(brain_db)
        job = db.find_job("lm", "run-1")
        assert job is not None
        assert [(p.size, p.state) for p in db.plans(job.id)] == [(3, "applied"), (4, "applied")]
        assert db.samples(job.id)[-1].world_size == 3  # what the Brain took a resumed job's size from
        db.close()
        brain.start()  # same database, same port
        (status,) = httpx.get(f"{url}/v1/status", timeout=10).json()["jobs"]
        assert status["sizes"] == {"trainer": 4}  # before any new sample
        client.report(speeds_at(4))
        wait_flushed(client)
        answer = client.plan()
        assert answer is not None
        (plan,) = answer.roles
        assert (plan.size, plan.state, plan.reason) == (
            5,
            "proposed",
            "trainer 4 -> 5: 5 nodes not measured yet",
        )
    finally:
        client.close()
        brain.stop()
    db = BrainDatabase(brain_db)
    job = db.find_job("lm", "run-1")
    assert job is not None
    assert [p.size for p in db.plans(job.id)] == [3, 4, 5]  # none issued twice
    event = db.events(job.id)[-1]
    assert (event.kind, event.detail["world_size"], event.state) == ("throughput_measured", 4, "planned")
    log = (tmp_path / "brain.log").read_text()
    assert "resumed 1 administrators" in log and "job lm run run-1 resumed at sizes {'trainer': 4}" in log
    db.close()


def test_the_buffer_is_bounded_and_counts_what_it_drops(tmp_path: Path) -> None:
    client = BrainClient(f"http://127.0.0.1:{free_port()}", buffer_limit=10, retry_min_s=60)
    client.job_started(registration())
    client.report(batch(0, 25))
    assert (client.buffered, client.dropped, client.mode) == (10, 15, BrainMode.SINGLE_JOB)
    client.close()


@pytest.fixture
def postgres() -> Iterator[PostgresServer]:
    try:
        server = PostgresServer()
        server.start()
    except PostgresUnavailable as exc:
        pytest.skip(f"no PostgreSQL server can be started here: {exc}")
    try:
        yield server
    finally:
        server.close()


def test_database_stopped_and_restarted(tmp_path: Path, postgres: PostgresServer) -> None:
    brain = BrainProcess(postgres.url, free_port(), tmp_path / "brain.log")
    brain.start()
    client = BrainClient(f"http://127.0.0.1:{brain.port}", retry_min_s=0.05, retry_max_s=0.2, timeout_s=5)
    try:
        client.job_started(registration())
        client.report(batch(0, 5))
        assert client.buffered == 0
        postgres.stop()  # the database server process, by its PID
        client.report(batch(5, 20))
        assert client.mode is BrainMode.SINGLE_JOB and client.buffered == 20
        assert "503" in client.last_error
        postgres.start()
        wait_flushed(client)
    finally:
        client.close()
        brain.stop()
    db = BrainDatabase(postgres.url)
    job = db.find_job("lm", "run-1")
    assert job is not None and len(db.samples(job.id)) == 25
    db.close()
