"""RemoteJobClient against an in-memory emulation of the Ray Jobs REST API (httpx.MockTransport),
whose launchers answer mailbox requests in their logs."""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest

from dlu_api.client import wire
from dlu_api.client.remote import LAUNCH_COMMAND, RemoteJobClient, dlu_api_version
from dlu_api.errors import (
    ClusterError,
    ClusterSetupError,
    DLUError,
    JobNameTakenError,
    JobNotFoundError,
    NotSupportedError,
    SpecError,
    SubmittedFromItselfError,
    VersionMismatchError,
)
from dlu_api.spec.models import JobSpec
from dlu_api.status import ActorStatus, JobEvent, JobStage, JobStatus, RoleStatus

ADDRESS = "http://head.example:8265"
ACCEPTED = wire.line(wire.ACCEPTED, {"name": "demo", "dlu_prime": "0.1.0", wire.MAILBOX: True}) + "\n"

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
    logs: list[str] = field(default_factory=lambda: [ACCEPTED])  # one per log read; the last repeats
    metadata: dict[str, str] = field(default_factory=dict[str, str])
    start_time: int = 0
    entrypoint: str = ""
    driver_exit_code: int | None = None
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
        # mailbox requests (package uploads): action -> the launcher's answer (None: no answer)
        self.answers: dict[str, dict[str, Any] | None] = {}
        self.mail: list[dict[str, Any]] = []
        self.deleted: list[str] = []

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
            metadata = body.get("metadata") or {}
            self.submitted.append(body)
            job = self.next_job
            job.metadata = metadata
            job.entrypoint = body["entrypoint"]
            job.start_time = job.start_time or 1_000 + len(self.jobs)  # newer than any earlier run
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
                        "driver_exit_code": job.driver_exit_code,
                    }
                    for sid, job in self.jobs.items()
                ],
            )
        if request.method == "PUT" and path.startswith("/api/packages/gcs/_dlu_mail."):
            return self._mail(path.rsplit("/", 1)[1], json.loads(request.content))
        parts = path.strip("/").split("/")  # api, jobs, <sid>[, stop|logs]
        if len(parts) < 3 or parts[:2] != ["api", "jobs"]:
            return httpx.Response(404, text="Not Found")
        job = self.jobs.get(parts[2])
        if job is None:
            return httpx.Response(404, text=f"Job {parts[2]} does not exist")
        if len(parts) == 3 and request.method == "GET":
            return httpx.Response(
                200,
                json={
                    "status": job.next_status(),
                    "message": job.message,
                    "entrypoint": job.entrypoint,
                    "driver_exit_code": job.driver_exit_code,
                },
            )
        if len(parts) == 3 and request.method == "DELETE":
            self.deleted.append(parts[2])
            del self.jobs[parts[2]]
            return httpx.Response(200, json=True)
        if parts[3:] == ["stop"] and request.method == "POST":
            job.stop_requested = True
            return httpx.Response(200, json={"stopped": True})
        if parts[3:] == ["logs"] and request.method == "GET":
            return httpx.Response(200, json={"logs": job.next_logs()})
        return httpx.Response(405, text="Method Not Allowed")

    def _mail(self, package: str, body: dict[str, Any]) -> httpx.Response:
        """The launcher of job `<name>` reads the request and answers in its log."""
        _, job_name, request_id, _ = package.split(".")
        self.mail.append({"job": job_name, **body})
        answer = self.answers.get(str(body["action"]))
        if answer is not None:
            line = wire.line(wire.ANSWER, {"id": request_id, **answer}) + "\n"
            job = self.jobs[f"dlu-{job_name}"]
            job.logs = [text + line for text in job.logs]
        return httpx.Response(200)


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

    (body,) = server.submitted
    sid = body["submission_id"]
    # is the name free (no run of it still going), submit, then wait for the launcher's verdict
    assert [(r.method, str(r.url)) for r in server.requests] == [
        ("GET", f"{ADDRESS}/api/jobs/"),
        ("POST", f"{ADDRESS}/api/jobs/"),
        ("GET", f"{ADDRESS}/api/jobs/{sid}"),
        ("GET", f"{ADDRESS}/api/jobs/{sid}/logs"),
    ]
    assert body["entrypoint"].startswith(LAUNCH_COMMAND + " ")
    argv = shlex.split(body["entrypoint"])
    assert argv[:7] == ["python", "-m", "dlu_prime", "launch", "--api-version", "0.1.0", "--spec-json"]
    assert len(argv) == 8  # the whole spec is one shell word
    assert JobSpec.model_validate(json.loads(argv[-1])) == spec
    assert re.fullmatch(r"dlu-demo-[0-9a-f]{8}", sid)  # fresh per run: Ray keeps old ones
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


def test_a_job_submitted_from_inside_its_own_actor_is_refused_before_any_request(
    server: FakeRayJobServer, client: RemoteJobClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    spec = demo_spec()
    monkeypatch.setenv("DLU_JOB", spec.name)
    monkeypatch.setenv("DLU_ACTOR", f"{spec.name}.worker.0")
    with pytest.raises(SubmittedFromItselfError, match="from inside its own actor"):
        client.submit(spec)
    assert server.requests == []


def add_job(server: FakeRayJobServer, job: FakeJob, name: str = "demo") -> FakeJob:
    """A launcher job already on the cluster (as if submitted earlier)."""
    job.metadata = job.metadata or {"dlu_job": name}
    job.entrypoint = job.entrypoint or f"{LAUNCH_COMMAND} --spec-json '{demo_spec().model_dump_json()}'"
    server.jobs[f"dlu-{name}"] = job
    return job


def launcher_log(*statuses: JobStatus, accepted: bool = True, extra: str = "") -> str:
    lines = [ACCEPTED.strip()] if accepted else []
    lines += ["[demo] stage RUNNING"] + [wire.status_line(s) for s in statuses]
    return "\n".join(lines) + "\n" + extra


def test_name_taken_by_a_running_job(server: FakeRayJobServer, client: RemoteJobClient) -> None:
    add_job(server, FakeJob(statuses=["RUNNING"]))
    with pytest.raises(JobNameTakenError) as info:
        client.submit(demo_spec())
    assert "a job named 'demo' is still RUNNING on http://head.example:8265" in str(info.value)
    assert "dlu stop demo --address" in str(info.value)
    assert server.submitted == []


def test_name_of_a_finished_job_is_reused(server: FakeRayJobServer, client: RemoteJobClient) -> None:
    add_job(server, FakeJob(statuses=["SUCCEEDED"]))
    server.next_job = FakeJob(statuses=["RUNNING"])
    assert client.submit(demo_spec()) == "demo"
    assert len(server.submitted) == 1
    assert server.submitted[0]["submission_id"] != "dlu-demo"  # a new record; the old one is history
    assert [j.name for j in client.list_jobs()] == ["demo"]


def test_name_of_a_job_whose_launcher_reported_its_end_is_free(
    server: FakeRayJobServer, client: RemoteJobClient
) -> None:
    """The launcher writes the final status, then exits: Ray still says RUNNING meanwhile."""
    final = JobStatus(name="demo", stage=JobStage.STOPPED, exit_code=0)
    add_job(server, FakeJob(statuses=["RUNNING"], logs=[launcher_log(final)]))
    assert client.submit(demo_spec()) == "demo"


def test_name_taken_by_a_pending_job(server: FakeRayJobServer, client: RemoteJobClient) -> None:
    add_job(server, FakeJob(statuses=["PENDING"]))
    with pytest.raises(JobNameTakenError, match="still PENDING"):
        client.submit(demo_spec())


def test_name_taken_reported_by_the_launcher(server: FakeRayJobServer, client: RemoteJobClient) -> None:
    """A PrimeMaster of that name runs on the cluster though its Ray job record is gone."""
    error = wire.line(wire.ERROR, {"kind": wire.KIND_NAME_TAKEN, "message": "job 'demo' is still RUNNING"})
    server.next_job = FakeJob(statuses=["FAILED"], logs=[f"error: x\n{error}\n"])
    with pytest.raises(JobNameTakenError, match="job 'demo' is still RUNNING"):
        client.submit(demo_spec())


def test_spec_refused_on_the_cluster_keeps_every_problem(
    server: FakeRayJobServer, client: RemoteJobClient
) -> None:
    problems = [
        {
            "field": "roles[worker].entrypoint",
            "message": "module 'pkg' cannot be imported",
            "fix": "install it",
        },
        {"field": "roles", "message": "the job needs 9 CPU", "fix": "add nodes"},
    ]
    error = wire.line(wire.ERROR, {"kind": wire.KIND_SPEC, "message": "invalid", "problems": problems})
    server.next_job = FakeJob(statuses=["RUNNING", "FAILED"], logs=["", f"{error}\n"])
    with pytest.raises(SpecError) as info:
        client.submit(demo_spec())
    assert [p.field for p in info.value.problems] == ["roles[worker].entrypoint", "roles"]
    assert "Fix: install it" in str(info.value)


def test_version_mismatch_reported_by_the_launcher(server: FakeRayJobServer, client: RemoteJobClient) -> None:
    message = "the driver's dlu-api 9.0.0 does not work with this cluster's dlu-prime 0.1.0"
    error = wire.line(wire.ERROR, {"kind": wire.KIND_VERSION, "message": message})
    server.next_job = FakeJob(statuses=["FAILED"], logs=[f"{error}\n"])
    with pytest.raises(VersionMismatchError, match=r"dlu-api 9\.0\.0"):
        client.submit(demo_spec())


def test_older_launcher_that_does_not_know_the_version_flag(
    server: FakeRayJobServer, client: RemoteJobClient
) -> None:
    log = "usage: python -m dlu_prime [-h] {launch,stop,status} ...\n" + (
        "python -m dlu_prime: error: unrecognized arguments: --api-version 0.1.0\n"
    )
    server.next_job = FakeJob(statuses=["FAILED"], logs=[log])
    with pytest.raises(VersionMismatchError, match="older than this driver"):
        client.submit(demo_spec())


def test_dlu_prime_missing_on_the_cluster(server: FakeRayJobServer, client: RemoteJobClient) -> None:
    log = "Running entrypoint for job dlu-demo: python -m dlu_prime launch ...\n" + (
        "/home/ray/anaconda3/bin/python: No module named dlu_prime\n"
    )
    server.next_job = FakeJob(statuses=["PENDING", "FAILED"], logs=["", log])
    with pytest.raises(ClusterSetupError) as info:
        client.submit(demo_spec())
    assert "dlu-prime is not installed on the Ray cluster at http://head.example:8265" in str(info.value)
    assert "docs/kubernetes.md" in str(info.value)


def test_other_launcher_failure_shows_the_end_of_its_log(
    server: FakeRayJobServer, client: RemoteJobClient
) -> None:
    log = "".join(f"line {i}\n" for i in range(40)) + "RuntimeError: boom\n"
    server.next_job = FakeJob(statuses=["FAILED"], logs=[log], message="exit code 1")
    with pytest.raises(ClusterError) as info:
        client.submit(demo_spec())
    text = str(info.value)
    assert "job 'demo' failed on http://head.example:8265 before DLU could run it (exit code 1)" in text
    assert "  | RuntimeError: boom" in text
    assert "line 10\n" not in text  # only the end


def test_submit_without_a_verdict_returns_after_the_timeout(server: FakeRayJobServer) -> None:
    server.next_job = FakeJob(statuses=["PENDING"], logs=[""])
    client = RemoteJobClient(
        ADDRESS, poll_interval_s=0.01, accept_timeout_s=0.05, transport=httpx.MockTransport(server)
    )
    assert client.submit(demo_spec()) == "demo"


def test_job_agent_missing_on_the_head() -> None:
    client = make_client(
        lambda request: httpx.Response(503, text="No available agent to submit job, please try again later.")
    )
    with pytest.raises(ClusterSetupError, match=r"no job agent.*ray\[default\]"):
        client.submit(demo_spec())


@pytest.mark.parametrize("code", [401, 403])
def test_auth_token_needed(code: int) -> None:
    client = make_client(lambda request: httpx.Response(code, text="Unauthorized"))
    with pytest.raises(ClusterError, match="RAY_AUTH_TOKEN"):
        client.submit(demo_spec())


def test_auth_token_is_sent(server: FakeRayJobServer, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RAY_AUTH_TOKEN", "s3cret")
    client = make_client(server)
    client.submit(demo_spec())
    assert {r.headers.get("authorization") for r in server.requests} == {"Bearer s3cret"}


def test_workdir_is_passed_to_the_launcher(server: FakeRayJobServer) -> None:
    client = RemoteJobClient(
        ADDRESS, poll_interval_s=0, workdir="/app code", transport=httpx.MockTransport(server)
    )
    client.submit(demo_spec())
    argv = shlex.split(server.submitted[0]["entrypoint"])
    assert argv[argv.index("--workdir") + 1] == "/app code"


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

RUNNING_STATUS = JobStatus(
    name="demo",
    stage=JobStage.RUNNING,
    roles=[
        RoleStatus(
            name="worker",
            kind="custom",
            restart_count=1,
            actors=[
                ActorStatus(name="demo.worker.0", role="worker", rank=0, stage="RUNNING", restart_count=1)
            ],
        )
    ],
)


def test_status_of_a_running_job_is_what_its_launcher_published(
    server: FakeRayJobServer, client: RemoteJobClient
) -> None:
    events = [
        wire.event_line(JobEvent(time=float(i), kind="step", message=f"e{i}", seq=i + 1)) for i in range(120)
    ]
    log = launcher_log(
        JobStatus(name="demo", stage=JobStage.INIT), RUNNING_STATUS, extra="\n".join(events) + "\n"
    )
    add_job(server, FakeJob(statuses=["RUNNING"], logs=[log]))
    status = client.status("demo")
    assert status.model_copy(update={"events": []}) == RUNNING_STATUS
    assert [e.message for e in status.events] == [f"e{i}" for i in range(120)]  # the whole timeline
    assert client.events("demo") == status.events
    assert server.submitted == [] and server.mail == []  # no Ray job, no request


def test_status_of_an_older_launcher_keeps_the_events_of_its_status_line(
    server: FakeRayJobServer, client: RemoteJobClient
) -> None:
    with_events = RUNNING_STATUS.model_copy(
        update={"events": [JobEvent(time=1.0, kind="job_created", message="x")]}
    )
    add_job(server, FakeJob(statuses=["RUNNING"], logs=[launcher_log(with_events)]))
    assert client.status("demo") == with_events


def test_status_before_the_launcher_accepted(server: FakeRayJobServer, client: RemoteJobClient) -> None:
    add_job(server, FakeJob(statuses=["PENDING"], logs=[""]))
    status = client.status("demo")
    assert (status.stage, status.exit_code) == (JobStage.PENDING, None)


def test_status_of_a_finished_job_is_its_final_status(
    server: FakeRayJobServer, client: RemoteJobClient
) -> None:
    final = RUNNING_STATUS.model_copy(update={"stage": JobStage.STOPPED, "exit_code": 0, "reason": "done"})
    add_job(server, FakeJob(statuses=["SUCCEEDED"], logs=[launcher_log(RUNNING_STATUS, final)]))
    assert client.status("demo") == final


@pytest.mark.parametrize(
    ("ray_status", "driver_exit_code", "final_code", "expected"),
    [
        ("FAILED", 130, 130, 130),  # stopped by `dlu stop`: the launcher exits with the job's 130
        ("SUCCEEDED", 0, 0, 0),
        ("FAILED", 3, 3, 3),
        ("FAILED", 1, None, 1),  # the launcher died before its final status
        ("STOPPED", None, None, 1),  # `ray job stop`
    ],
)
def test_list_and_status_agree_on_exit_codes(
    server: FakeRayJobServer,
    client: RemoteJobClient,
    ray_status: str,
    driver_exit_code: int | None,
    final_code: int | None,
    expected: int,
) -> None:
    finals = (
        [] if final_code is None else [JobStatus(name="demo", stage=JobStage.STOPPED, exit_code=final_code)]
    )
    add_job(server, FakeJob(statuses=[ray_status], logs=[launcher_log(RUNNING_STATUS, *finals)],
                            driver_exit_code=driver_exit_code))  # fmt: skip
    (listed,) = client.list_jobs()
    assert listed.exit_code == client.status("demo").exit_code == expected


def test_status_of_a_job_that_failed_to_launch(server: FakeRayJobServer, client: RemoteJobClient) -> None:
    add_job(server, FakeJob(statuses=["FAILED"], logs=["python: No module named dlu_prime\n"]))
    status = client.status("demo")
    assert (status.stage, status.exit_code) == (JobStage.STOPPED, 1)
    assert "dlu-prime is not installed" in status.reason


def test_status_of_a_launcher_killed_mid_run(server: FakeRayJobServer, client: RemoteJobClient) -> None:
    add_job(server, FakeJob(statuses=["STOPPED"], logs=[launcher_log(RUNNING_STATUS)], message="stopped"))
    status = client.status("demo")
    assert (status.stage, status.exit_code) == (JobStage.STOPPED, 1)
    assert status.roles == RUNNING_STATUS.roles
    assert "its launcher ended (STOPPED)" in status.reason


def test_status_of_unknown_job(client: RemoteJobClient) -> None:
    with pytest.raises(JobNotFoundError, match="'ghost'"):
        client.status("ghost")


def test_status_server_error_is_a_cluster_error() -> None:
    client = make_client(lambda request: httpx.Response(503, text="busy"))
    with pytest.raises(ClusterError, match=r"\(503\): busy"):
        client.status("demo")


def test_wait_reports_stage_changes_from_the_log_without_probes(
    server: FakeRayJobServer, client: RemoteJobClient
) -> None:
    init = JobStatus(name="demo", stage=JobStage.INIT)
    final = RUNNING_STATUS.model_copy(update={"stage": JobStage.STOPPED, "exit_code": 3, "reason": "failed"})
    add_job(
        server,
        FakeJob(
            statuses=["PENDING", "RUNNING", "RUNNING", "RUNNING", "FAILED"],
            logs=["", launcher_log(init), launcher_log(init, RUNNING_STATUS), launcher_log(init, RUNNING_STATUS),
                  launcher_log(init, RUNNING_STATUS, final)],
        ),
    )  # fmt: skip
    seen: list[JobStatus] = []
    assert client.wait("demo", seen.append) == final
    assert [s.stage for s in seen] == [JobStage.PENDING, JobStage.INIT, JobStage.RUNNING, JobStage.STOPPED]
    assert seen[-1].exit_code == 3


def test_run_submits_then_waits(server: FakeRayJobServer, client: RemoteJobClient) -> None:
    final = JobStatus(name="demo", stage=JobStage.STOPPED, exit_code=0)
    server.next_job = FakeJob(statuses=["RUNNING", "SUCCEEDED"], logs=[launcher_log(final)])
    assert client.run(demo_spec()) == final
    assert len(server.submitted) == 1


def test_wait_on_unknown_job(client: RemoteJobClient) -> None:
    with pytest.raises(JobNotFoundError):
        client.wait("ghost")


def test_events_of_unknown_job(client: RemoteJobClient) -> None:
    with pytest.raises(JobNotFoundError, match="'ghost'"):
        client.events("ghost")


# --- stop ---------------------------------------------------------------------------------


def test_stop_asks_the_launcher_through_the_mailbox(
    server: FakeRayJobServer, client: RemoteJobClient
) -> None:
    job = add_job(server, FakeJob(statuses=["RUNNING"]))
    server.answers["stop"] = {"result": {"stopped": True}}
    client.stop("demo")
    assert server.mail == [{"job": "demo", "action": "stop"}]
    assert not job.stop_requested  # the launcher ends by itself once the job has stopped
    assert server.submitted == []


def test_stop_before_the_launcher_accepted_stops_the_ray_job(
    server: FakeRayJobServer, client: RemoteJobClient
) -> None:
    job = add_job(server, FakeJob(statuses=["PENDING"], logs=[""]))
    client.stop("demo")
    assert job.stop_requested
    assert server.mail == []


def test_stop_when_the_launcher_finds_no_master_stops_the_ray_job(
    server: FakeRayJobServer, client: RemoteJobClient
) -> None:
    job = add_job(server, FakeJob(statuses=["RUNNING"]))
    server.answers["stop"] = {"result": {"stopped": False}}
    client.stop("demo")
    assert job.stop_requested


def test_a_request_nobody_answers_times_out_with_a_pointer_to_the_log(server: FakeRayJobServer) -> None:
    add_job(server, FakeJob(statuses=["RUNNING"]))
    client = RemoteJobClient(
        ADDRESS, poll_interval_s=0, transport=httpx.MockTransport(server), request_timeout_s=0.3
    )
    with pytest.raises(ClusterError, match=r"did not answer 'get_step' within 0 s.*dlu events -f demo"):
        client.debug("demo", "get_step", "worker")


def test_a_request_to_a_job_that_ends_meanwhile_is_not_found(
    server: FakeRayJobServer, client: RemoteJobClient
) -> None:
    add_job(server, FakeJob(statuses=["RUNNING", "RUNNING", "SUCCEEDED"]))
    with pytest.raises(JobNotFoundError, match="stopped before it answered"):
        client.debug("demo", "get_step", "worker")


def test_a_launcher_without_a_mailbox_is_named(server: FakeRayJobServer, client: RemoteJobClient) -> None:
    old = wire.line(wire.ACCEPTED, {"name": "demo", "dlu_prime": "0.1.0"}) + "\n"
    add_job(server, FakeJob(statuses=["RUNNING"], logs=[old]))
    with pytest.raises(ClusterSetupError, match="upgrade dlu-prime on the cluster"):
        client.debug("demo", "get_step", "worker")


def test_stop_of_a_finished_job_does_nothing(server: FakeRayJobServer, client: RemoteJobClient) -> None:
    job = add_job(server, FakeJob(statuses=["SUCCEEDED"]))
    client.stop("demo")
    assert not job.stop_requested
    assert server.mail == []


def test_stop_unknown_job(client: RemoteJobClient) -> None:
    with pytest.raises(JobNotFoundError, match="'ghost'"):
        client.stop("ghost")


def test_stop_server_error() -> None:
    client = make_client(lambda request: httpx.Response(500, text="nope"))
    with pytest.raises(ClusterError, match=r"cannot list jobs \(500\): nope"):
        client.stop("demo")


# --- timeline (the launcher's log) ---------------------------------------------------------------------------------


def test_timeline_without_follow(server: FakeRayJobServer, client: RemoteJobClient) -> None:
    job = add_job(server, FakeJob(statuses=["RUNNING"], logs=["one\ntwo\nthree\n"]))
    assert list(client.timeline("demo")) == ["one", "two", "three"]
    assert job.status_reads == 0  # without follow the job's state is never asked for


def test_timeline_leave_out_wire_lines(server: FakeRayJobServer, client: RemoteJobClient) -> None:
    add_job(server, FakeJob(statuses=["RUNNING"], logs=[launcher_log(RUNNING_STATUS)]))
    assert list(client.timeline("demo")) == ["[demo] stage RUNNING"]


def test_timeline_without_follow_keeps_a_partial_last_line(
    server: FakeRayJobServer, client: RemoteJobClient
) -> None:
    add_job(server, FakeJob(statuses=["RUNNING"], logs=["one\n\ntwo\npart"]))
    assert list(client.timeline("demo")) == ["one", "", "two", "part"]


def test_timeline_of_empty_job(server: FakeRayJobServer, client: RemoteJobClient) -> None:
    add_job(server, FakeJob(statuses=["PENDING"], logs=[""]))
    assert list(client.timeline("demo")) == []


def test_timeline_follow_yields_every_line_once_in_order(
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
    job = add_job(
        server, FakeJob(statuses=["PENDING", "RUNNING", "RUNNING", "RUNNING", "SUCCEEDED"], logs=growth)
    )
    lines = list(client.timeline("demo", follow=True))
    assert lines == ["a1", "a2", "half done", "b1", "b2", "last"]
    assert job.status_reads == 5  # followed until the job finished, then stopped polling


def test_timeline_follow_flushes_a_final_partial_line(
    server: FakeRayJobServer, client: RemoteJobClient
) -> None:
    add_job(server, FakeJob(statuses=["RUNNING", "FAILED"], logs=["x\n", "x\ny\n", "x\ny\nTraceback: boom"]))
    assert list(client.timeline("demo", follow=True)) == ["x", "y", "Traceback: boom"]


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
        # a probe job of an older driver is no DLU job
        "dlu-probe-new-status-1234": FakeJob(["RUNNING"], metadata={"dlu_job": "new", "dlu_probe": "status"}),
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


# --- debug --------------------------------------------------------------------------------------
def test_debug_goes_through_the_mailbox_and_returns_the_answer(
    server: FakeRayJobServer, client: RemoteJobClient
) -> None:
    add_job(server, FakeJob(statuses=["RUNNING"]))
    server.answers["get_step"] = {"result": {"demo.worker.0": 41}}
    assert client.debug("demo", "get_step", "worker", rank=0) == {"demo.worker.0": 41}
    assert server.mail == [{"job": "demo", "action": "get_step", "role": "worker", "rank": 0, "step": None}]
    assert server.submitted == []


def test_debug_errors_from_the_prime_master_are_plain(
    server: FakeRayJobServer, client: RemoteJobClient
) -> None:
    add_job(server, FakeJob(statuses=["RUNNING"]))
    server.answers["get_step"] = {"error": "job demo has no role 'nope'; roles: worker"}
    with pytest.raises(DLUError, match="has no role 'nope'"):
        client.debug("demo", "get_step", "nope")


def test_debug_of_a_stopped_job_is_not_found(server: FakeRayJobServer, client: RemoteJobClient) -> None:
    add_job(server, FakeJob(statuses=["SUCCEEDED"]))
    with pytest.raises(JobNotFoundError, match="has stopped"):
        client.debug("demo", "get_step", "worker")
    assert server.mail == []


def test_scale_goes_through_the_mailbox(server: FakeRayJobServer, client: RemoteJobClient) -> None:
    add_job(server, FakeJob(statuses=["RUNNING"]))
    answer = {"role": "workers", "old_size": 2, "new_size": 6, "done": True, "failed": False, "message": "ok"}
    server.answers["scale"] = {"result": answer}
    assert client.scale("demo", "workers", 6) == answer
    assert server.mail == [{"job": "demo", "action": "scale", "role": "workers", "size": 6}]


def test_scale_refused_on_the_cluster_keeps_the_message(
    server: FakeRayJobServer, client: RemoteJobClient
) -> None:
    add_job(server, FakeJob(statuses=["RUNNING"]))
    server.answers["scale"] = {"error": "size 9 for role 'workers' is above its max_total=4: give at most 4"}
    with pytest.raises(DLUError, match="above its max_total=4: give at most 4"):
        client.scale("demo", "workers", 9)


def test_scale_of_a_stopped_job_is_refused(server: FakeRayJobServer, client: RemoteJobClient) -> None:
    add_job(server, FakeJob(statuses=["SUCCEEDED"]))
    with pytest.raises(JobNotFoundError, match="dlu scale needs a running job"):
        client.scale("demo", "workers", 3)


def test_workdir_forms(tmp_path: Any) -> None:
    from dlu_api.client.remote import working_dir

    here = str(tmp_path)
    assert working_dir(None) == (None, None)
    assert working_dir(here) == (None, here)  # a directory on this machine: uploaded
    assert working_dir(f"cluster:{here}") == (here, None)  # named on the nodes, even if here too
    assert working_dir("/srv/app-only-on-the-nodes") == ("/srv/app-only-on-the-nodes", None)
    assert working_dir("s3://bucket/code.zip") == (None, "s3://bucket/code.zip")  # Ray fetches it


# --- rank logs (Ray's dashboard log API) ----------------------------------------------------


class FakeClusterWithLogs(FakeRayJobServer):
    """The job server plus the dashboard's log endpoints, one node holding the run's files."""

    def __init__(self, files: dict[str, bytes]) -> None:
        super().__init__()
        self.files = files

    def __call__(self, request: httpx.Request) -> httpx.Response:
        path = request.url.path
        query = dict(request.url.params)
        if path == "/api/v0/nodes":
            self.requests.append(request)
            return httpx.Response(
                200,
                json={"result": True, "data": {"result": {"result": [{"node_id": "n1", "state": "ALIVE"}]}}},
            )
        if path == "/api/v0/logs":
            self.requests.append(request)
            assert query["node_id"] == "n1" and query["glob"] == "dlu/demo/run7/*/rank*.*"
            return httpx.Response(
                200, json={"result": True, "data": {"result": {"worker_out": sorted(self.files)}}}
            )
        if path == "/api/v0/logs/file":
            self.requests.append(request)
            return httpx.Response(200, content=self.files[query["filename"]])
        return super().__call__(request)


def _logs_job(server: FakeRayJobServer, **status: Any) -> None:
    final = JobStatus(
        name="demo", stage=JobStage.RUNNING, roles=[RoleStatus(name="worker", kind="simple")], **status
    )
    add_job(server, FakeJob(statuses=["RUNNING"], logs=[launcher_log(final)]))


def test_rank_logs_of_the_run_the_launcher_reported() -> None:
    server = FakeClusterWithLogs(
        {
            "dlu/demo/run7/worker/rank0.out": b"zero\n",
            "dlu/demo/run7/worker/rank1.out": b"one\n",
            "dlu/demo/run7/worker/rank1.err": b"err\n",
        }
    )
    _logs_job(server, run_id="run7")
    client = make_client(server)
    assert list(client.logs("demo")) == [
        "[worker/rank0] zero",
        "[worker/rank1] one",
        "[worker/rank1:err] err",
    ]
    assert list(client.logs("demo", rank=1)) == ["[worker/rank1] one", "[worker/rank1:err] err"]
    with pytest.raises(DLUError, match="no rank logs for role worker and rank 5"):
        list(client.logs("demo", role="worker", rank=5))
    with pytest.raises(DLUError, match="no role 'trainer'; its roles: worker"):
        list(client.logs("demo", role="trainer"))


def test_rank_logs_need_a_run_and_rays_own_log_dir() -> None:
    server = FakeClusterWithLogs({})
    _logs_job(server)
    with pytest.raises(DLUError, match="has no rank logs yet: it has not started a run"):
        list(make_client(server).logs("demo"))
    server = FakeClusterWithLogs({})
    _logs_job(server, run_id="run7", log_dir="/data/logs")
    with pytest.raises(NotSupportedError, match=r"writes its rank logs to /data/logs on each node"):
        list(make_client(server).logs("demo"))
