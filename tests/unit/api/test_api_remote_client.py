"""RemoteJobClient against an in-memory emulation of the Ray Jobs REST API (httpx.MockTransport)."""

from __future__ import annotations

import json
import shlex
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest

from dlu_api.client.remote import LAUNCH_COMMAND, RemoteJobClient, dlu_api_version
from dlu_api.errors import ClusterError, JobNotFoundError, NotSupportedError, SpecError
from dlu_api.spec.models import JobSpec
from dlu_api.status import JobStage, JobStatus

ADDRESS = "http://head.example:8265"

SPEC_DATA: dict[str, Any] = {
    "name": "demo",
    "device_type": "CPU",
    "device_per_node": 0,
    "roles": [{"name": "worker", "entrypoint": "pkg.mod:main", "total": 2}],
}


def demo_spec(**changes: Any) -> JobSpec:
    return JobSpec.model_validate({**SPEC_DATA, **changes})


@dataclass
class FakeJob:
    statuses: list[str]  # one per status read; the last repeats
    message: str = ""
    logs: list[str] = field(default_factory=lambda: [""])  # one per log read; the last repeats
    metadata: dict[str, str] = field(default_factory=dict[str, str])
    start_time: int = 0
    stop_requested: bool = False
    status_reads: int = 0
    log_reads: int = 0

    def next_status(self) -> str:
        value = self.statuses[min(self.status_reads, len(self.statuses) - 1)]
        self.status_reads += 1
        return value

    def next_logs(self) -> str:
        value = self.logs[min(self.log_reads, len(self.logs) - 1)]
        self.log_reads += 1
        return value


class FakeRayJobServer:
    """Answers like a Ray head's job server; records every request."""

    def __init__(self) -> None:
        self.jobs: dict[str, FakeJob] = {}
        self.requests: list[httpx.Request] = []
        self.submitted: list[dict[str, Any]] = []
        self.next_job: FakeJob = FakeJob(statuses=["PENDING", "RUNNING", "SUCCEEDED"])

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        path = request.url.path
        if request.method == "POST" and path == "/api/jobs/":
            body = json.loads(request.content)
            sid = body["submission_id"]
            if sid in self.jobs:
                return httpx.Response(
                    400, text=f"Job with submission_id {sid} already exists. Please use another."
                )
            self.submitted.append(body)
            job = self.next_job
            job.metadata = body.get("metadata") or {}
            self.jobs[sid] = job
            return httpx.Response(200, json={"submission_id": sid})
        if request.method == "GET" and path == "/api/jobs/":
            return httpx.Response(
                200,
                json=[
                    {
                        "submission_id": sid,
                        "status": job.statuses[-1],
                        "metadata": job.metadata or None,
                        "start_time": job.start_time,
                    }
                    for sid, job in self.jobs.items()
                ],
            )
        parts = path.strip("/").split("/")  # api, jobs, <sid>[, stop|logs]
        if len(parts) < 3 or parts[:2] != ["api", "jobs"]:
            return httpx.Response(404, text="Not Found")
        job = self.jobs.get(parts[2])
        if job is None:
            return httpx.Response(404, text=f"Job {parts[2]} does not exist")
        if len(parts) == 3 and request.method == "GET":
            return httpx.Response(200, json={"status": job.next_status(), "message": job.message})
        if parts[3:] == ["stop"] and request.method == "POST":
            job.stop_requested = True
            return httpx.Response(200, json={"stopped": True})
        if parts[3:] == ["logs"] and request.method == "GET":
            return httpx.Response(200, json={"logs": job.next_logs()})
        return httpx.Response(405, text="Method Not Allowed")


@pytest.fixture
def server() -> FakeRayJobServer:
    return FakeRayJobServer()


def make_client(handler: Callable[[httpx.Request], httpx.Response]) -> RemoteJobClient:
    return RemoteJobClient(ADDRESS, poll_interval_s=0, transport=httpx.MockTransport(handler))


@pytest.fixture
def client(server: FakeRayJobServer) -> RemoteJobClient:
    return make_client(server)


# --- submit -------------------------------------------------------------------------------


def test_submit_sends_the_launcher_with_the_spec_inline(
    server: FakeRayJobServer, client: RemoteJobClient
) -> None:
    spec = demo_spec(config={"lr": 0.001, "note": 'it\'s "quoted" $HOME'})
    assert client.submit(spec) == "demo"

    (request,) = server.requests
    assert request.method == "POST"
    assert str(request.url) == f"{ADDRESS}/api/jobs/"
    (body,) = server.submitted
    assert body["entrypoint"].startswith(LAUNCH_COMMAND + " ")
    assert body["entrypoint"].startswith("python -m dlu_prime launch --spec-json")
    argv = shlex.split(body["entrypoint"])
    assert argv[:5] == ["python", "-m", "dlu_prime", "launch", "--spec-json"]
    assert len(argv) == 6  # the whole spec is one shell word
    assert JobSpec.model_validate(json.loads(argv[-1])) == spec
    assert body["submission_id"] == "dlu-demo"
    assert body["metadata"] == {"dlu_job": "demo", "dlu_api_version": dlu_api_version()}
    assert body["metadata"]["dlu_api_version"] == "0.1.0"


def test_invalid_spec_is_refused_before_any_request(
    server: FakeRayJobServer, client: RemoteJobClient
) -> None:
    bad = JobSpec.model_validate(
        {**SPEC_DATA, "roles": [{"name": "worker", "entrypoint": "pkg.mod:main", "total": 0}]}
    )
    with pytest.raises(SpecError) as info:
        client.submit(bad)
    assert any("total" in p.field for p in info.value.problems)
    assert server.requests == []


def test_name_already_taken(server: FakeRayJobServer, client: RemoteJobClient) -> None:
    client.submit(demo_spec())
    with pytest.raises(ClusterError, match="already exists") as info:
        client.submit(demo_spec())
    assert "'demo'" in str(info.value)
    assert "pick another name" in str(info.value)


def test_conflict_status_means_name_taken() -> None:
    client = make_client(lambda request: httpx.Response(409, text="conflict"))
    with pytest.raises(ClusterError, match="already exists"):
        client.submit(demo_spec())


@pytest.mark.parametrize("code", [404, 405])
def test_no_job_server_points_at_ray_default(code: int) -> None:
    client = make_client(lambda request: httpx.Response(code, text="Not Found"))
    with pytest.raises(ClusterError) as info:
        client.submit(demo_spec())
    assert "ray[default]" in str(info.value)
    assert ADDRESS in str(info.value)


def test_other_refusal_carries_the_server_text() -> None:
    client = make_client(lambda request: httpx.Response(500, text="  head is on fire \n"))
    with pytest.raises(ClusterError, match=r"\(500\): head is on fire$"):
        client.submit(demo_spec())


def test_connection_refused_names_the_address() -> None:
    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("[Errno 111] Connection refused", request=request)

    client = make_client(refuse)
    for call in (
        lambda: client.submit(demo_spec()),
        lambda: client.status("demo"),
        lambda: client.stop("demo"),
        lambda: client.list_jobs(),
        lambda: list(client.logs("demo")),
    ):
        with pytest.raises(ClusterError) as info:
            call()
        assert ADDRESS in str(info.value)
        assert "ConnectError" in str(info.value)
        assert "8265" in str(info.value)


def test_address_trailing_slash_is_dropped(server: FakeRayJobServer) -> None:
    client = RemoteJobClient(ADDRESS + "/", poll_interval_s=0, transport=httpx.MockTransport(server))
    assert client.address == ADDRESS
    client.submit(demo_spec())
    assert server.requests[0].url.path == "/api/jobs/"


# --- status and wait ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("ray_status", "stage", "exit_code"),
    [
        ("PENDING", JobStage.PENDING, None),
        ("RUNNING", JobStage.RUNNING, None),
        ("SUCCEEDED", JobStage.STOPPED, 0),
        ("FAILED", JobStage.STOPPED, 1),
        ("STOPPED", JobStage.STOPPED, 1),
        ("SOMETHING_NEW", JobStage.PENDING, None),
    ],
)
def test_status_maps_ray_states(
    server: FakeRayJobServer,
    client: RemoteJobClient,
    ray_status: str,
    stage: JobStage,
    exit_code: int | None,
) -> None:
    server.next_job = FakeJob(statuses=[ray_status], message="the message")
    client.submit(demo_spec())
    status = client.status("demo")
    assert status == JobStatus(name="demo", stage=stage, exit_code=exit_code, reason="the message")
    assert status.finished is (stage is JobStage.STOPPED)
    assert server.requests[-1].url.path == "/api/jobs/dlu-demo"


def test_status_of_unknown_job(client: RemoteJobClient) -> None:
    with pytest.raises(JobNotFoundError, match="'ghost'"):
        client.status("ghost")


def test_status_server_error_is_a_cluster_error() -> None:
    client = make_client(lambda request: httpx.Response(503, text="busy"))
    with pytest.raises(ClusterError, match=r"\(503\): busy"):
        client.status("demo")


def test_wait_polls_until_terminal_and_reports_only_changes(
    server: FakeRayJobServer, client: RemoteJobClient
) -> None:
    server.next_job = FakeJob(
        statuses=["PENDING", "PENDING", "RUNNING", "RUNNING", "RUNNING", "FAILED"],
        message="",
    )
    client.submit(demo_spec())
    seen: list[JobStatus] = []
    final = client.wait("demo", seen.append)

    assert server.jobs["dlu-demo"].status_reads == 6
    assert [s.stage for s in seen] == [JobStage.PENDING, JobStage.RUNNING, JobStage.STOPPED]
    assert seen[-1] == final
    assert final.exit_code == 1


def test_run_submits_then_waits(server: FakeRayJobServer, client: RemoteJobClient) -> None:
    server.next_job = FakeJob(statuses=["RUNNING", "SUCCEEDED"])
    final = client.run(demo_spec())
    assert final.stage is JobStage.STOPPED
    assert final.exit_code == 0
    assert len(server.submitted) == 1


def test_wait_on_unknown_job(client: RemoteJobClient) -> None:
    with pytest.raises(JobNotFoundError):
        client.wait("ghost")


def test_events_are_not_supported_yet_with_a_pointer_to_logs(
    server: FakeRayJobServer, client: RemoteJobClient
) -> None:
    server.next_job = FakeJob(statuses=["RUNNING"])
    client.submit(demo_spec())
    with pytest.raises(NotSupportedError, match="dlu logs demo"):
        client.events("demo")
    with pytest.raises(JobNotFoundError, match="'ghost'"):
        client.events("ghost")


# --- stop ---------------------------------------------------------------------------------


def test_stop(server: FakeRayJobServer, client: RemoteJobClient) -> None:
    client.submit(demo_spec())
    client.stop("demo")
    assert server.jobs["dlu-demo"].stop_requested
    request = server.requests[-1]
    assert (request.method, request.url.path) == ("POST", "/api/jobs/dlu-demo/stop")


def test_stop_unknown_job(client: RemoteJobClient) -> None:
    with pytest.raises(JobNotFoundError, match="'ghost'"):
        client.stop("ghost")


def test_stop_server_error() -> None:
    client = make_client(lambda request: httpx.Response(500, text="nope"))
    with pytest.raises(ClusterError, match="cannot stop job 'demo'"):
        client.stop("demo")


# --- logs ---------------------------------------------------------------------------------


def test_logs_without_follow(server: FakeRayJobServer, client: RemoteJobClient) -> None:
    server.next_job = FakeJob(statuses=["RUNNING"], logs=["one\ntwo\nthree\n"])
    client.submit(demo_spec())
    assert list(client.logs("demo")) == ["one", "two", "three"]
    # without follow the job's state is never asked for
    assert server.jobs["dlu-demo"].status_reads == 0


def test_logs_without_follow_keeps_a_partial_last_line(
    server: FakeRayJobServer, client: RemoteJobClient
) -> None:
    server.next_job = FakeJob(statuses=["RUNNING"], logs=["one\n\ntwo\npart"])
    client.submit(demo_spec())
    assert list(client.logs("demo")) == ["one", "", "two", "part"]


def test_logs_of_empty_job(server: FakeRayJobServer, client: RemoteJobClient) -> None:
    server.next_job = FakeJob(statuses=["PENDING"], logs=[""])
    client.submit(demo_spec())
    assert list(client.logs("demo")) == []


def test_logs_follow_yields_every_line_once_in_order(
    server: FakeRayJobServer, client: RemoteJobClient
) -> None:
    growth = [
        "",
        "a1\n",
        "a1\na2\nhal",  # a partial line waits for its end
        "a1\na2\nhalf done\n",
        "a1\na2\nhalf done\nb1\nb2\n",
        "a1\na2\nhalf done\nb1\nb2\nlast\n",  # written between the final status read and logs
    ]
    server.next_job = FakeJob(statuses=["PENDING", "RUNNING", "RUNNING", "RUNNING", "SUCCEEDED"], logs=growth)
    client.submit(demo_spec())
    lines = list(client.logs("demo", follow=True))
    assert lines == ["a1", "a2", "half done", "b1", "b2", "last"]
    job = server.jobs["dlu-demo"]
    assert job.status_reads == 5  # followed until the job finished, then stopped polling


def test_logs_follow_flushes_a_final_partial_line(server: FakeRayJobServer, client: RemoteJobClient) -> None:
    server.next_job = FakeJob(statuses=["RUNNING", "FAILED"], logs=["x\n", "x\ny\n", "x\ny\nTraceback: boom"])
    client.submit(demo_spec())
    assert list(client.logs("demo", follow=True)) == ["x", "y", "Traceback: boom"]


def test_logs_of_unknown_job(client: RemoteJobClient) -> None:
    with pytest.raises(JobNotFoundError, match="'ghost'"):
        list(client.logs("ghost"))


def test_logs_server_error_is_a_cluster_error() -> None:
    client = make_client(lambda request: httpx.Response(500, text="internal error"))
    with pytest.raises(ClusterError, match=r"\(500\): internal error"):
        list(client.logs("demo"))


# --- list ---------------------------------------------------------------------------------


def test_list_jobs_keeps_dlu_jobs_newest_first(server: FakeRayJobServer) -> None:
    server.jobs = {
        "dlu-old": FakeJob(["SUCCEEDED"], metadata={"dlu_job": "old"}, start_time=1_000),
        "raysubmit_xyz": FakeJob(["RUNNING"], metadata={}, start_time=5_000),
        "other": FakeJob(["RUNNING"], metadata={"owner": "someone"}, start_time=6_000),
        "dlu-new": FakeJob(["RUNNING"], metadata={"dlu_job": "new"}, start_time=3_000),
        "dlu-mid": FakeJob(["FAILED"], metadata={"dlu_job": "mid"}, start_time=2_000),
    }
    jobs = make_client(server).list_jobs()
    assert [(j.name, j.stage, j.exit_code) for j in jobs] == [
        ("new", JobStage.RUNNING, None),
        ("mid", JobStage.STOPPED, 1),
        ("old", JobStage.STOPPED, 0),
    ]
    assert {j.where for j in jobs} == {ADDRESS}


def test_list_jobs_of_a_submitted_job(server: FakeRayJobServer, client: RemoteJobClient) -> None:
    client.submit(demo_spec())
    (job,) = client.list_jobs()
    assert job.name == "demo"


def test_list_jobs_without_job_server() -> None:
    client = make_client(lambda request: httpx.Response(404, text="Not Found"))
    with pytest.raises(ClusterError, match=r"ray\[default\]"):
        client.list_jobs()
