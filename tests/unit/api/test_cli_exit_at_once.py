"""`dlu run` ends its process at once when its client says what it holds ends with the process
(`JobClient.close_at_exit`), and only once the job has ended: with the job's code, after its
output is out. Otherwise (the default, a job that never ended) it closes and exits as before."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

import dlu_api.cli
from dlu_api.cli import app
from dlu_api.client.base import JobClient, StatusCallback
from dlu_api.spec.models import JobSpec
from dlu_api.status import JobStage, JobStatus, JobSummary

runner = CliRunner()

SPEC = {
    "name": "demo",
    "device_type": "CPU",
    "device_per_node": 0,
    "roles": [{"name": "worker", "entrypoint": "m:f", "total": 1, "resources": {"cpu": 1}}],
}


class ExitingClient(JobClient):
    """Runs nothing; its job ends with `code`; `at_once` is what close_at_exit answers."""

    def __init__(self, code: int, at_once: bool, fail_submit: bool = False) -> None:
        self.code = code
        self.at_once = at_once
        self.fail_submit = fail_submit
        self.calls: list[str] = []

    def submit(self, spec: JobSpec) -> str:
        self.calls.append("submit")
        if self.fail_submit:
            raise KeyboardInterrupt
        return spec.name

    def resume(self, spec: JobSpec) -> str:
        return self.submit(spec)

    def wait(self, name: str, on_update: StatusCallback | None = None) -> JobStatus:
        self.calls.append("wait")
        return JobStatus(name=name, stage=JobStage.STOPPED, exit_code=self.code, reason="done")

    def close_at_exit(self) -> bool:
        self.calls.append("close_at_exit")
        return self.at_once

    def close(self) -> None:
        self.calls.append("close")

    def status(self, name: str) -> JobStatus:
        raise NotImplementedError

    def stop(self, name: str) -> None:
        raise NotImplementedError

    def logs(
        self, name: str, follow: bool = False, role: str | None = None, rank: int | None = None
    ) -> Iterator[str]:
        raise NotImplementedError

    def list_jobs(self) -> list[JobSummary]:
        return []


class Exited(Exception):
    def __init__(self, code: int) -> None:
        self.code = code


@pytest.fixture
def spec_file(tmp_path: Path) -> Path:
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(SPEC))
    return path


def run_with(client: ExitingClient, spec_file: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    def fake_exit(code: int) -> None:
        raise Exited(code)

    monkeypatch.delenv("DLU_ADDRESS", raising=False)
    monkeypatch.setattr(dlu_api.cli, "connect", lambda *args, **kwargs: client)
    monkeypatch.setattr(os, "_exit", fake_exit)
    return runner.invoke(app, ["run", str(spec_file)])


@pytest.mark.parametrize("code", [0, 3])
def test_an_ended_job_ends_the_process_at_once_with_its_code(
    code: int, spec_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    client = ExitingClient(code, at_once=True)
    result = run_with(client, spec_file, monkeypatch)
    assert isinstance(result.exception, Exited) and result.exception.code == code, result.output
    assert client.calls == ["submit", "wait", "close_at_exit"]
    assert f"job demo: STOPPED (exit code {code})" in result.output  # printed before the exit


def test_a_client_that_must_be_closed_exits_as_usual(
    spec_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    client = ExitingClient(3, at_once=False)
    result = run_with(client, spec_file, monkeypatch)
    assert result.exit_code == 3 and not isinstance(result.exception, Exited), result.output
    assert client.calls == ["submit", "wait", "close_at_exit"]


def test_a_job_that_never_ended_is_closed_not_left(spec_file: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    client = ExitingClient(0, at_once=True, fail_submit=True)
    result = run_with(client, spec_file, monkeypatch)
    assert result.exit_code == 130 and not isinstance(result.exception, Exited), result.output
    assert client.calls == ["submit", "close"]
