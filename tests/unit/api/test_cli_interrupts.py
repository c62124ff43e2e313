"""Interrupts of `dlu run`, as real signals this process sends itself while the CLI runs in it:
the first stops the job cleanly, a second one stops it at once, and further ones cannot cut the
end short (the job's record would stay STOPPING). SIGTERM counts as a Ctrl-C."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

import dlu_api.cli
from dlu_api.cli import SECOND_INTERRUPT_REASON, app
from dlu_api.client import JobClient, StatusCallback
from dlu_api.spec.models import JobSpec
from dlu_api.status import JobStage, JobStatus, JobSummary

pytestmark = pytest.mark.timeout(60)

SPEC = {
    "name": "demo",
    "device_type": "CPU",
    "device_per_node": 0,
    "roles": [{"name": "worker", "entrypoint": "pkg.mod:main", "total": 1}],
}
runner = CliRunner()


def interrupt(signum: int = signal.SIGINT) -> None:
    """Deliver `signum` to this process and give its handler the chance to run."""
    os.kill(os.getpid(), signum)
    time.sleep(0.5)


class SignallingClient(JobClient):
    """Each `wait` is cut short by the next signal of `during_wait` (none left: the job ends
    STOPPED 130); `stop_now` and `close` are hit by one more SIGINT each."""

    def __init__(self, during_wait: list[int]) -> None:
        self.during_wait = during_wait
        self.calls: list[tuple[str, Any]] = []

    def submit(self, spec: JobSpec) -> str:
        self.calls.append(("submit", spec.name))
        return spec.name

    def resume(self, spec: JobSpec) -> str:
        raise NotImplementedError

    def wait(self, name: str, on_update: StatusCallback | None = None) -> JobStatus:
        self.calls.append(("wait", name))
        if self.during_wait:
            interrupt(self.during_wait.pop(0))
            raise AssertionError("the signal did not interrupt wait()")
        return JobStatus(name=name, stage=JobStage.STOPPED, exit_code=130, reason="stopped by user request")

    def stop(self, name: str) -> None:
        self.calls.append(("stop", name))

    def stop_now(self, name: str, reason: str = "") -> JobStatus:
        self.calls.append(("stop_now", reason))
        interrupt()  # a third Ctrl-C while the job is being killed
        self.calls.append(("stop_now done", None))
        return JobStatus(name=name, stage=JobStage.STOPPED, exit_code=130, reason=reason)

    def close(self) -> None:
        interrupt()  # while the embedded Ray shuts down
        self.calls.append(("closed", None))

    def status(self, name: str) -> JobStatus:
        raise NotImplementedError

    def logs(
        self, name: str, follow: bool = False, role: str | None = None, rank: int | None = None
    ) -> Iterator[str]:
        raise NotImplementedError

    def list_jobs(self) -> list[JobSummary]:
        return []


@pytest.fixture
def spec_file(tmp_path: Path) -> Path:
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(SPEC))
    return path


def run_with(client: SignallingClient, spec_file: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.delenv("DLU_ADDRESS", raising=False)
    monkeypatch.setattr(dlu_api.cli, "connect", lambda *args, **kwargs: client)
    before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    result = runner.invoke(app, ["run", str(spec_file)])
    # the command leaves this process's signal handlers as it found them
    assert {s: signal.getsignal(s) for s in before} == before
    return result


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_one_interrupt_stops_the_job_cleanly(
    signum: int, spec_file: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    client = SignallingClient([signum])
    result = run_with(client, spec_file, monkeypatch)
    assert result.exit_code == 130, result.output
    assert client.calls == [
        ("submit", "demo"),
        ("wait", "demo"),
        ("stop", "demo"),
        ("wait", "demo"),
        ("closed", None),
    ]
    assert "interrupted: stopping job demo" in result.output
    assert "job demo: STOPPED (exit code 130)" in result.output
    assert "shutting down, a moment" in capfd.readouterr().err  # the SIGINT during close()


def test_a_second_interrupt_stops_the_job_at_once_and_a_third_cannot_cut_that_short(
    spec_file: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    client = SignallingClient([signal.SIGINT, signal.SIGINT])
    result = run_with(client, spec_file, monkeypatch)
    assert result.exit_code == 130, result.output
    assert client.calls == [
        ("submit", "demo"),
        ("wait", "demo"),
        ("stop", "demo"),
        ("wait", "demo"),
        ("stop_now", SECOND_INTERRUPT_REASON),
        ("stop_now done", None),
        ("closed", None),
    ]
    assert "interrupted again: stopping job demo at once" in result.output
    assert f"reason: {SECOND_INTERRUPT_REASON}" in result.output
    notes = capfd.readouterr().err
    assert "already stopping job demo at once" in notes and "kill -9" in notes


def test_an_interrupt_before_the_job_started_closes_the_client(
    spec_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    client = SignallingClient([])

    def interrupted_submit(spec: JobSpec) -> str:
        client.calls.append(("submit", spec.name))
        raise KeyboardInterrupt

    client.submit = interrupted_submit  # type: ignore[method-assign]
    result = run_with(client, spec_file, monkeypatch)
    assert result.exit_code == 130
    assert "job demo was not started" in result.output
    assert client.calls == [("submit", "demo"), ("closed", None)]
