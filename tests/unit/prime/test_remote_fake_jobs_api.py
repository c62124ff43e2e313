"""A remote driver and a launcher that meet only through a Jobs API server, over real HTTP.

The server is a small fake of Ray's job server on port 0 (jobs, logs, package upload); the
launcher side is dlu-prime's own StatusPublisher and Mailbox, whose GCS calls read the fake's
package store. So the whole path is exercised: status from published lines, requests through
the mailbox, one exit-code rule, working-directory upload, `dlu run --no-wait`.
"""

from __future__ import annotations

import io
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from fake_jobs_api import SPEC, FakeJobsApi, serve, until
from typer.testing import CliRunner

import dlu_api.cli as cli
from dlu_api.cli import app
from dlu_api.client import remote_upload, wire
from dlu_api.client.remote import RemoteJobClient
from dlu_api.errors import DLUError, JobNotFoundError, SpecError
from dlu_api.spec.models import JobSpec
from dlu_api.status import JobStage

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def api(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[FakeJobsApi, str]]:
    with serve(monkeypatch) as served:
        yield served


def submitted(fake: FakeJobsApi) -> int:
    return sum(1 for method, path in fake.requests if method == "POST" and path == "/api/jobs/")


def test_status_events_debug_and_stop_start_no_ray_job(api: tuple[FakeJobsApi, str]) -> None:
    fake, address = api
    client = RemoteJobClient(address, poll_interval_s=0.05)
    client.submit(JobSpec.model_validate(SPEC))
    until(lambda: client.status("demo").stage is JobStage.RUNNING)
    until(lambda: (client.status("demo").roles[0].actors[0].step or 0) > 5)  # steps, per interval
    assert [e.message for e in client.events("demo")] == ["INIT", "RUNNING"]
    assert client.debug("demo", "get_step", "worker") == {"demo.worker.0": 7}
    with pytest.raises(DLUError, match="no role 'nope'"):
        client.debug("demo", "get_step", "nope")
    assert not any(k.startswith(wire.mail_prefix("demo")) for k in fake.packages)  # taken, deleted
    client.stop("demo")
    until(lambda: client.status("demo").finished)
    final = client.status("demo")
    assert (final.exit_code, final.reason) == (130, "stopped by user request")
    (listed,) = client.list_jobs()
    assert listed.exit_code == final.exit_code == 130
    assert submitted(fake) == 1  # the launcher only: no probe job for status, debug or stop
    with pytest.raises(JobNotFoundError, match="has stopped"):
        client.debug("demo", "get_step", "worker")


def test_workdir_upload_like_ray_job_submit(api: tuple[FakeJobsApi, str], tmp_path: Path) -> None:
    fake, address = api
    code = tmp_path / "code"
    (code / "pkg").mkdir(parents=True)
    (code / "pkg" / "mod.py").write_text("def main() -> None: ...\n")
    (code / "run.sh").write_text("#!/bin/sh\n")
    (code / "run.sh").chmod(0o755)
    for skipped in (".git", ".venv", "pkg/__pycache__"):
        (code / skipped).mkdir()
        (code / skipped / "big").write_bytes(b"\0" * 1000)
    client = RemoteJobClient(address, poll_interval_s=0.05, workdir=str(code))
    client.submit(JobSpec.model_validate(SPEC))
    ((key, data),) = [(k, v) for k, v in fake.packages.items() if k.startswith("gcs://_ray_pkg_")]
    (job,) = fake.jobs.values()
    assert job.body["runtime_env"] == {"working_dir": key}
    assert "--workdir" not in job.body["entrypoint"]  # the launcher runs in the unpacked package
    with zipfile.ZipFile(io.BytesIO(data)) as archive:
        assert sorted(archive.namelist()) == ["pkg/mod.py", "run.sh"]
        assert archive.getinfo("run.sh").external_attr >> 16 & 0o777 == 0o755
    client.stop("demo")
    until(lambda: client.status("demo").finished)

    puts = sum(1 for method, _ in fake.requests if method == "PUT")
    client.submit(JobSpec.model_validate(SPEC))  # unchanged: found on the cluster, not sent again
    assert sum(1 for method, _ in fake.requests if method == "PUT") == puts
    assert remote_upload.package(code)[0] == key.removeprefix("gcs://")  # content-addressed, stable


def test_upload_over_the_limit_is_refused_before_any_request(
    api: tuple[FakeJobsApi, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake, address = api
    (tmp_path / "data.bin").write_bytes(b"\1" * (2 * 2**20))
    monkeypatch.setenv(remote_upload.LIMIT_ENV, "1")
    client = RemoteJobClient(address, workdir=str(tmp_path))
    with pytest.raises(SpecError, match=r"more than the upload limit of 1 MiB .*raise DLU_UPLOAD_LIMIT_MB"):
        client.submit(JobSpec.model_validate(SPEC))
    assert fake.requests == []
    monkeypatch.setenv(remote_upload.LIMIT_ENV, "lots")
    with pytest.raises(SpecError, match="DLU_UPLOAD_LIMIT_MB='lots' is not a size"):
        client.submit(JobSpec.model_validate(SPEC))


def test_workdir_on_the_cluster_is_not_uploaded(api: tuple[FakeJobsApi, str], tmp_path: Path) -> None:
    fake, address = api
    client = RemoteJobClient(address, poll_interval_s=0.05, workdir=f"cluster:{tmp_path}")
    client.submit(JobSpec.model_validate(SPEC))
    (job,) = fake.jobs.values()
    assert f"--workdir {tmp_path}" in job.body["entrypoint"] and "runtime_env" not in job.body
    assert not fake.packages
    client.stop("demo")


def test_run_no_wait_returns_once_running(
    api: tuple[FakeJobsApi, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Plain lines until RUNNING, no live view even in a terminal: the job goes on after it."""
    fake, address = api
    path = tmp_path / "demo.yaml"
    path.write_text(yaml.safe_dump(SPEC))
    monkeypatch.setattr(cli, "job_console", lambda *_: pytest.fail("a live view of a --no-wait run"))
    result = CliRunner().invoke(app, ["run", "--no-wait", str(path), "--address", address])
    assert result.exit_code == 0, result.output
    assert "job demo is RUNNING" in result.output
    assert f"dlu stop demo --address {address}" in result.output
    (job,) = fake.jobs.values()
    assert job.status == "RUNNING"  # left running
    RemoteJobClient(address).stop("demo")
