"""Jobs on a Ray cluster through the Ray Jobs REST API; needs only an HTTP client.

The job's entrypoint is the dlu-prime launcher, given the same JSON spec a local run uses.
"""

from __future__ import annotations

import shlex
import time
from collections.abc import Iterator
from importlib.metadata import PackageNotFoundError, version
from typing import Any

import httpx

from dlu_api.client.base import JobClient, StatusCallback
from dlu_api.errors import ClusterError, JobNotFoundError, NotSupportedError
from dlu_api.spec.models import JobSpec
from dlu_api.spec.rules import ensure_valid
from dlu_api.status import JobEvent, JobStage, JobStatus, JobSummary

SUBMISSION_PREFIX = "dlu-"
LAUNCH_COMMAND = "python -m dlu_prime launch --spec-json"

_RAY_TO_STAGE = {
    "PENDING": JobStage.PENDING,
    "RUNNING": JobStage.RUNNING,
    "STOPPED": JobStage.STOPPED,
    "SUCCEEDED": JobStage.STOPPED,
    "FAILED": JobStage.STOPPED,
}


def dlu_api_version() -> str:
    try:
        return version("dlu-api")
    except PackageNotFoundError:
        return "0+unknown"


def submission_id(name: str) -> str:
    return f"{SUBMISSION_PREFIX}{name}"


def launch_entrypoint(spec: JobSpec, resume: bool = False) -> str:
    """The shell command the cluster runs: the dlu-prime launcher with the spec inline."""
    command = LAUNCH_COMMAND.replace(" launch ", " launch --resume ") if resume else LAUNCH_COMMAND
    return f"{command} {shlex.quote(spec.model_dump_json())}"


class RemoteJobClient(JobClient):
    """Talks to a Ray head's job server (the dashboard port, 8265 by default)."""

    def __init__(
        self,
        address: str,
        *,
        timeout_s: float = 30.0,
        poll_interval_s: float = 1.0,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self.address = address.rstrip("/")
        self._poll = poll_interval_s
        self._http = httpx.Client(base_url=self.address, timeout=timeout_s, transport=transport)

    def close(self) -> None:
        self._http.close()

    def _request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        try:
            response = self._http.request(method, path, **kwargs)
        except httpx.TransportError as exc:
            raise ClusterError(
                f"cannot reach the Ray cluster at {self.address} ({exc.__class__.__name__}: {exc}); "
                "check the address and that the head's dashboard port (8265) is reachable."
            ) from None
        return response

    def _no_job_server(self) -> ClusterError:
        return ClusterError(
            f"{self.address} answers but has no Ray job server; install Ray with its default extras "
            "on the cluster (`pip install 'ray[default]'`) and start the head with the dashboard."
        )

    def submit(self, spec: JobSpec) -> str:
        return self._submit(spec, resume=False)

    def resume(self, spec: JobSpec) -> str:
        return self._submit(spec, resume=True)

    def _submit(self, spec: JobSpec, resume: bool) -> str:
        ensure_valid(spec)
        body = {
            "entrypoint": launch_entrypoint(spec, resume),
            "submission_id": submission_id(spec.name),
            "metadata": {"dlu_job": spec.name, "dlu_api_version": dlu_api_version()},
        }
        response = self._request("POST", "/api/jobs/", json=body)
        if response.status_code in (404, 405):
            raise self._no_job_server()
        if response.status_code >= 400:
            text = response.text
            if "already exists" in text or response.status_code == 409:
                raise ClusterError(
                    f"a job named {spec.name!r} already exists on {self.address}; "
                    "pick another name or `dlu stop` the old one first."
                )
            raise ClusterError(f"the cluster refused the job ({response.status_code}): {text.strip()}")
        return spec.name

    def _job_info(self, name: str) -> dict[str, Any]:
        response = self._request("GET", f"/api/jobs/{submission_id(name)}")
        if response.status_code == 404:
            raise JobNotFoundError(f"no job named {name!r} on {self.address}; `dlu list` shows the jobs.")
        if response.status_code >= 400:
            raise ClusterError(f"cannot read job {name!r} ({response.status_code}): {response.text.strip()}")
        info: dict[str, Any] = response.json()
        return info

    def status(self, name: str) -> JobStatus:
        info = self._job_info(name)
        ray_status = str(info.get("status", "PENDING"))
        exit_code: int | None = None
        if ray_status == "SUCCEEDED":
            exit_code = 0
        elif ray_status in ("FAILED", "STOPPED"):
            exit_code = 1
        return JobStatus(
            name=name,
            stage=_RAY_TO_STAGE.get(ray_status, JobStage.PENDING),
            exit_code=exit_code,
            reason=str(info.get("message") or ""),
        )

    def events(self, name: str) -> list[JobEvent]:
        """Not yet: the Ray Jobs API status carries no DLU timeline. The job's log holds it."""
        status = self.status(name)  # JobNotFoundError first, as for every other command
        if status.events:
            return list(status.events)
        raise NotSupportedError(
            f"the event timeline of a job on a cluster is not available yet from {self.address}; "
            f"`dlu logs {name}` prints the job's log, which includes its events"
        )

    def wait(self, name: str, on_update: StatusCallback | None = None) -> JobStatus:
        last: JobStatus | None = None
        while True:
            current = self.status(name)
            if on_update is not None and current != last:
                on_update(current)
            last = current
            if current.finished:
                return current
            time.sleep(self._poll)

    def stop(self, name: str) -> None:
        response = self._request("POST", f"/api/jobs/{submission_id(name)}/stop")
        if response.status_code == 404:
            raise JobNotFoundError(f"no job named {name!r} on {self.address}.")
        if response.status_code >= 400:
            raise ClusterError(f"cannot stop job {name!r} ({response.status_code}): {response.text.strip()}")

    def _log_text(self, name: str) -> str:
        response = self._request("GET", f"/api/jobs/{submission_id(name)}/logs")
        if response.status_code == 404:
            raise JobNotFoundError(f"no job named {name!r} on {self.address}.")
        if response.status_code >= 400:
            raise ClusterError(
                f"cannot read the logs of job {name!r} ({response.status_code}): {response.text.strip()}"
            )
        return str(response.json().get("logs", ""))

    def logs(self, name: str, follow: bool = False) -> Iterator[str]:
        seen = 0
        while True:
            text = self._log_text(name)
            complete = text[seen:].rpartition("\n")[0]
            if complete:
                yield from complete.split("\n")
                seen += len(complete) + 1
            if not follow or self.status(name).finished:
                rest = self._log_text(name)[seen:]
                if rest:
                    yield from rest.rstrip("\n").split("\n")
                return
            time.sleep(self._poll)

    def list_jobs(self) -> list[JobSummary]:
        response = self._request("GET", "/api/jobs/")
        if response.status_code == 404:
            raise self._no_job_server()
        if response.status_code >= 400:
            raise ClusterError(f"cannot list jobs ({response.status_code}): {response.text.strip()}")
        jobs: list[dict[str, Any]] = response.json()
        out: list[tuple[float, JobSummary]] = []
        for job in jobs:
            metadata: dict[str, Any] = job.get("metadata") or {}
            name = str(metadata.get("dlu_job") or "")
            if not name:
                continue
            stage = _RAY_TO_STAGE.get(str(job.get("status")), JobStage.PENDING)
            exit_code = {"SUCCEEDED": 0, "FAILED": 1, "STOPPED": 1}.get(str(job.get("status")))
            summary = JobSummary(name=name, stage=stage, exit_code=exit_code, where=self.address)
            out.append((float(job.get("start_time") or 0), summary))
        return [s for _, s in sorted(out, key=lambda item: -item[0])]
