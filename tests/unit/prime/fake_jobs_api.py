"""A small fake of Ray's job server on port 0, over real HTTP: jobs, their logs, package upload,
and (optionally) the dashboard's log API that serves a job's driver log whole, as a tail, or as
a stream of what is appended. `FakeJobsApi.launch` plays the cluster-side launcher with
dlu-prime's own StatusPublisher and Mailbox."""

from __future__ import annotations

import contextlib
import json
import threading
import time
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from dlu_api.client import wire
from dlu_api.status import ActorStatus, JobEvent, JobStage, JobStatus, RoleStatus
from dlu_prime import mailbox, ray_private
from dlu_prime.publish import StatusPublisher

SPEC = {  # the job every test submits
    "name": "demo",
    "device_type": "CPU",
    "device_per_node": 0,
    "roles": [{"name": "worker", "entrypoint": "pkg.mod:main", "total": 2}],
}
NODE = "fa4e" * 14  # the one node: every job's driver runs there


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
            "driver_node_id": None if self.status == "PENDING" else NODE,
        }


class FakeJobsApi:
    """Jobs, logs and packages as Ray's job server keeps them; `launch` plays the launcher."""

    def __init__(self, log_api: bool = False) -> None:
        self.jobs: dict[str, Job] = {}
        self.packages: dict[str, bytes] = {}  # "gcs://<name>" -> bytes, as the GCS KV holds them
        self.requests: list[tuple[str, str]] = []
        self.stop_launchers = threading.Event()
        self.threads: list[threading.Thread] = []
        self.log_api = log_api
        self.log_bytes_sent = 0  # of job logs, by either API: what a driver's reads cost
        self.sent_by: dict[str, int] = {}  # the same, by endpoint ("jobs", "file", "stream")
        self.break_streams = threading.Event()  # set: open streams break (and it is cleared)

    def log_bytes(self, sid: str, lines: int) -> tuple[bytes, int]:
        """A job's driver log, whole (`lines` -1) or its last `lines` lines; and the log's size."""
        job = self.jobs[sid]
        with job.lock:
            whole = "".join(job.log).encode()
            chosen = job.log if lines < 0 else job.log[-lines:] if lines else []
            return "".join(chosen).encode(), len(whole)

    def count(self, endpoint: str, sent: int) -> None:
        self.log_bytes_sent += sent
        self.sent_by[endpoint] = self.sent_by.get(endpoint, 0) + sent

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
                text = "".join(job.log)
            self.count("jobs", len(text.encode()))
            return 200, {"logs": text}
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


@contextlib.contextmanager
def serve(monkeypatch: pytest.MonkeyPatch, log_api: bool = False) -> Iterator[tuple[FakeJobsApi, str]]:
    """The fake on port 0 (with Ray's log API when `log_api`); (the fake, its address)."""
    fake = FakeJobsApi(log_api)
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
            if self.path.startswith("/api/v0/logs/") and fake.log_api:
                self._log_api()
                return
            length = int(self.headers.get("Content-Length") or 0)
            code, value = fake.handle(self.command, self.path, self.rfile.read(length))
            data = (value if isinstance(value, str) else json.dumps(value)).encode()
            self.send_response(code)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _log_api(self) -> None:
            """`/api/v0/logs/file` and `/api/v0/logs/stream` of a job's driver log on its driver
            node, as Ray's dashboard serves them: raw bytes; a stream sends what is appended until
            it breaks."""
            url = urllib.parse.urlsplit(self.path)
            query = dict(urllib.parse.parse_qsl(url.query))
            fake.requests.append(("GET", url.path))
            filename, lines = query.get("filename", ""), int(query.get("lines", "1000"))
            sid = filename.removeprefix("job-driver-").removesuffix(".log")
            if query.get("node_id") != NODE or sid not in fake.jobs:
                self.send_response(404)
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            data, sent = fake.log_bytes(sid, lines)
            self.send_response(200)
            if url.path.endswith("/file"):
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
                fake.count("file", len(data))
                return
            self.end_headers()  # no length: the body ends when the connection does
            try:
                self.wfile.write(data)
                self.wfile.flush()
                fake.count("stream", len(data))
                while not fake.stop_launchers.is_set():
                    if fake.break_streams.is_set():
                        fake.break_streams.clear()
                        return
                    new = fake.log_bytes(sid, -1)[0][sent:]
                    if new:
                        self.wfile.write(new)
                        self.wfile.flush()
                        fake.count("stream", len(new))
                        sent += len(new)
                    time.sleep(0.05)
            except OSError:  # the driver closed it
                return

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
