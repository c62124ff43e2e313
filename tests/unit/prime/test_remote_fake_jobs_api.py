"""A remote driver and a launcher that meet only through a Jobs API server, over real HTTP.

The server is a small fake of Ray's job server on port 0 (jobs, logs, package upload); the
launcher side is dlu-prime's own StatusPublisher and Mailbox, whose GCS calls read the fake's
package store. So the whole path is exercised: status from published lines, requests through
the mailbox, one exit-code rule, working-directory upload, `dlu run --no-wait`.
"""

from __future__ import annotations

import io
import json
import threading
import time
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from dlu_api.cli import app
from dlu_api.client import remote_upload, wire
from dlu_api.client.remote import RemoteJobClient
from dlu_api.errors import DLUError, JobNotFoundError, SpecError
from dlu_api.spec.models import JobSpec
from dlu_api.status import ActorStatus, JobEvent, JobStage, JobStatus, RoleStatus
from dlu_prime import mailbox, ray_private
from dlu_prime.publish import StatusPublisher

pytestmark = pytest.mark.timeout(60)

SPEC = {
    "name": "demo",
    "device_type": "CPU",
    "device_per_node": 0,
    "roles": [{"name": "worker", "entrypoint": "pkg.mod:main", "total": 2}],
}


@dataclass
class Job:
    body: dict[str, Any]
    status: str = "PENDING"
    log: list[str] = field(default_factory=list[str])
    driver_exit_code: int | None = None
    lock: threading.Lock = field(default_factory=threading.Lock)

    def emit(self, line: str) -> None:
        with self.lock:
            self.log.append(line + "\n")

    def info(self) -> dict[str, Any]:
        return {
            "submission_id": self.body["submission_id"],
            "status": self.status,
            "metadata": self.body.get("metadata"),
            "entrypoint": self.body["entrypoint"],
            "runtime_env": self.body.get("runtime_env"),
            "start_time": 1,
            "message": "",
            "driver_exit_code": self.driver_exit_code,
        }


class FakeJobsApi:
    """Jobs, logs and packages as Ray's job server keeps them; `launch` plays the launcher."""

    def __init__(self) -> None:
        self.jobs: dict[str, Job] = {}
        self.packages: dict[str, bytes] = {}  # "gcs://<name>" -> bytes, as the GCS KV holds them
        self.requests: list[tuple[str, str]] = []
        self.stop_launchers = threading.Event()
        self.threads: list[threading.Thread] = []

    def handle(self, method: str, path: str, body: bytes) -> tuple[int, Any]:
        self.requests.append((method, path))
        parts = path.strip("/").split("/")
        if parts[:2] == ["api", "packages"] and len(parts) == 4:
            key = f"{parts[2]}://{parts[3]}"
            if method == "PUT":
                self.packages[key] = body
                return 200, None
            return (200, None) if key in self.packages else (404, f"Package {key} does not exist")
        if path == "/api/jobs/" and method == "GET":
            return 200, [job.info() for job in self.jobs.values()]
        if path == "/api/jobs/" and method == "POST":
            request = json.loads(body)
            job = self.jobs[request["submission_id"]] = Job(request)
            thread = threading.Thread(target=self.launch, args=(job,), daemon=True)
            thread.start()
            self.threads.append(thread)
            return 200, {"submission_id": request["submission_id"]}
        job = self.jobs.get(parts[2]) if len(parts) >= 3 else None
        if job is None:
            return 404, f"Job {parts[-1]} does not exist"
        if len(parts) == 3:
            return 200, job.info()
        if parts[3] == "logs":
            with job.lock:
                return 200, {"logs": "".join(job.log)}
        if parts[3] == "stop":
            job.status = "STOPPED"
            return 200, {"stopped": True}
        return 405, "Method Not Allowed"

    def launch(self, job: Job) -> None:
        """The launcher: accepted, INIT, RUNNING, then steps; answers its mailbox on every poll."""
        name = job.body["metadata"]["dlu_job"]
        publisher = StatusPublisher(job.emit, interval_s=0.2)
        stopped = threading.Event()

        def answer(job_name: str, request: dict[str, Any]) -> dict[str, Any]:
            if request["action"] == "stop":
                stopped.set()
                return {"result": {"stopped": True}}
            if request["action"] == "get_step" and request["role"] == "worker":
                return {"result": {f"{job_name}.{request['role']}.0": 7}}
            return {"error": f"no role {request['role']!r}"}

        box = mailbox.Mailbox(name, job.emit, answer)
        job.status = "RUNNING"
        job.emit(wire.line(wire.ACCEPTED, {"name": name, "dlu_prime": "0.1.0", wire.MAILBOX: True}))
        events: list[JobEvent] = []
        step = 0
        while not stopped.is_set() and not self.stop_launchers.is_set():
            step += 1
            stage = JobStage.INIT if step < 3 else JobStage.RUNNING
            if step in (1, 3):
                events.append(
                    JobEvent(time=float(step), kind="stage", message=stage.value, seq=len(events) + 1)
                )
            actors = [ActorStatus(name=f"{name}.worker.0", role="worker", rank=0, stage="RUNNING", step=step)]
            roles = [RoleStatus(name="worker", kind="custom", actors=actors)]
            publisher(JobStatus(name=name, stage=stage, roles=roles, events=list(events)))
            box.poll()
            time.sleep(0.05)
        box.close()
        final = JobStatus(name=name, stage=JobStage.STOPPED, exit_code=130, reason="stopped by user request")
        publisher.final(final.model_copy(update={"events": events}))
        job.driver_exit_code, job.status = 130, "FAILED"


@pytest.fixture
def api(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[FakeJobsApi, str]]:
    fake = FakeJobsApi()
    # The launcher's GCS calls (through ray_private) reach the fake's package store.
    monkeypatch.setattr(
        ray_private,
        "kv_keys",
        lambda prefix, ns: [k.encode() for k in list(fake.packages) if k.startswith(prefix)],
    )
    monkeypatch.setattr(ray_private, "kv_get", lambda key, ns: fake.packages.get(key))
    monkeypatch.setattr(
        ray_private,
        "kv_delete",
        lambda key, ns, by_prefix=False: [
            fake.packages.pop(k) for k in list(fake.packages) if k == key or (by_prefix and k.startswith(key))
        ],
    )

    class Handler(BaseHTTPRequestHandler):
        def _serve(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            code, value = fake.handle(self.command, self.path, self.rfile.read(length))
            data = (value if isinstance(value, str) else json.dumps(value)).encode()
            self.send_response(code)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        do_GET = do_POST = do_PUT = do_DELETE = _serve

        def log_message(self, format: str, *args: Any) -> None:
            del format, args

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield fake, f"http://127.0.0.1:{server.server_address[1]}"
    fake.stop_launchers.set()
    for launcher in fake.threads:
        launcher.join(10)
    server.shutdown()
    server.server_close()


def until(condition: Any, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.05)


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


def test_run_no_wait_returns_once_running(api: tuple[FakeJobsApi, str], tmp_path: Path) -> None:
    fake, address = api
    path = tmp_path / "demo.yaml"
    path.write_text(yaml.safe_dump(SPEC))
    result = CliRunner().invoke(app, ["run", "--no-wait", str(path), "--address", address])
    assert result.exit_code == 0, result.output
    assert "job demo is RUNNING" in result.output
    assert f"dlu stop demo --address {address}" in result.output
    (job,) = fake.jobs.values()
    assert job.status == "RUNNING"  # left running
    RemoteJobClient(address).stop("demo")
