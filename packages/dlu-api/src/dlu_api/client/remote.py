"""Jobs on a Ray cluster through the Ray Jobs REST API; needs only an HTTP client.

The job's entrypoint is the dlu-prime launcher, given the same JSON spec a local run uses.
A driver cannot call the PrimeMaster from here (that needs Ray), so everything DLU-specific
goes through Ray jobs and their logs (`dlu_api.client.wire`):

- `submit` waits until the launcher reports the job accepted, or turns its failure into a
  plain error (bad spec on the cluster, name taken, dlu-prime missing, version mismatch);
- `status` of a running job runs a short *probe* job, `python -m dlu_prime status NAME`,
  which asks the PrimeMaster (or, without one, the job's state store) and prints the status;
  a finished job's status is the final one its launcher printed;
- `stop` runs the `stop` probe, so the PrimeMaster stops the job and the launcher cleans up.
Probe jobs are deleted once read and never listed.
"""

from __future__ import annotations

import json
import logging
import os
import shlex
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

import httpx

from dlu_api.client import remote_errors as errors
from dlu_api.client import wire
from dlu_api.client.base import JobClient, StatusCallback
from dlu_api.client.ray_logs import RayLogApi, RemoteRankLogs, rank_log_lines
from dlu_api.client.remote_delete import delete_runs
from dlu_api.errors import (
    ClusterError,
    ClusterSetupError,
    DLUError,
    JobNotFoundError,
    NotSupportedError,
    VersionMismatchError,
)
from dlu_api.rank_logs import RankFile
from dlu_api.spec.models import JobSpec
from dlu_api.spec.rules import ensure_valid
from dlu_api.status import JobEvent, JobStage, JobStatus, JobSummary

logger = logging.getLogger(__name__)

SUBMISSION_PREFIX = "dlu-"
PROBE_PREFIX = "dlu-probe-"
PRIME_COMMAND = "python -m dlu_prime"
LAUNCH_COMMAND = f"{PRIME_COMMAND} launch"
TOKEN_ENV = "RAY_AUTH_TOKEN"
TOKEN_PATH_ENV = "RAY_AUTH_TOKEN_PATH"

TERMINAL = ("SUCCEEDED", "FAILED", "STOPPED")
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


def new_submission_id(name: str) -> str:
    """A fresh Ray job id per run: Ray keeps a finished job's record and log under its id, so
    reusing one would mix an old run's log into the new one. The job is found by its metadata."""
    return f"{SUBMISSION_PREFIX}{name}-{uuid.uuid4().hex[:8]}"


def _prime_args(command: str) -> str:
    return f"{PRIME_COMMAND} {command} {wire.API_VERSION_FLAG} {shlex.quote(dlu_api_version())}"


def launch_entrypoint(spec: JobSpec, resume: bool = False, workdir: str | None = None) -> str:
    """The shell command the cluster runs: the dlu-prime launcher with the spec inline."""
    parts = [_prime_args("launch")]
    if workdir:
        parts.append(f"--workdir {shlex.quote(workdir)}")
    if resume:
        parts.append("--resume")
    parts.append(f"--spec-json {shlex.quote(spec.model_dump_json())}")
    return " ".join(parts)


def spec_from_entrypoint(entrypoint: str) -> dict[str, Any] | None:
    """The spec inside a launcher entrypoint; None if it holds none."""
    try:
        argv = shlex.split(entrypoint)
        value: dict[str, Any] = json.loads(argv[argv.index("--spec-json") + 1])
    except (ValueError, IndexError):
        return None
    return value


def find_token(explicit: str | None = None) -> str | None:
    """The Ray auth token to send: given, `$RAY_AUTH_TOKEN`, `$RAY_AUTH_TOKEN_PATH`'s file, or the
    file Ray itself uses (`~/.ray/auth_token`); None if there is none."""
    if explicit:
        return explicit
    if os.environ.get(TOKEN_ENV):
        return os.environ[TOKEN_ENV].strip()
    candidates = [os.environ.get(TOKEN_PATH_ENV), str(Path.home() / ".ray" / "auth_token")]
    for candidate in candidates:
        if candidate and Path(candidate).is_file():
            token = Path(candidate).read_text(encoding="utf-8").strip()
            if token:
                return token
    return None


class RemoteJobClient(JobClient):
    """Talks to a Ray head's job server (the dashboard port, 8265 by default).

    Args:
        workdir: a directory on the cluster's nodes that holds the job's code (relative
            entrypoints and modules are found there); default: where Ray runs entrypoints.
        accept_timeout_s: how long `submit` waits for the launcher to accept the job; 0: no wait.
        probe_timeout_s: how long a status or stop probe may take.
        token: Ray auth token (see `find_token`).
    """

    def __init__(
        self,
        address: str,
        *,
        timeout_s: float = 30.0,
        poll_interval_s: float = 1.0,
        transport: httpx.BaseTransport | None = None,
        workdir: str | None = None,
        accept_timeout_s: float = 180.0,
        probe_timeout_s: float = 120.0,
        token: str | None = None,
    ) -> None:
        self.address = address.rstrip("/")
        self.workdir = workdir
        self._poll = poll_interval_s
        self._accept_timeout = accept_timeout_s
        self._probe_timeout = probe_timeout_s
        token = find_token(token)
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._http = httpx.Client(
            base_url=self.address, timeout=timeout_s, transport=transport, headers=headers
        )

    def close(self) -> None:
        self._http.close()

    # HTTP --------------------------------------------------------------------------------------
    def _request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        try:
            return self._http.request(method, path, **kwargs)
        except httpx.TransportError as exc:
            raise errors.unreachable(self.address, exc) from None

    def _not_found(self, name: str, response: httpx.Response) -> Exception:
        if "does not exist" in response.text:
            return JobNotFoundError(f"no job named {name!r} on {self.address}; `dlu list` shows the jobs.")
        return errors.no_job_server(self.address)

    def _post_job(self, body: dict[str, Any]) -> httpx.Response:
        response = self._request("POST", "/api/jobs/", json=body)
        if response.status_code in (404, 405):
            raise errors.no_job_server(self.address)
        return response

    def _job_info_by_id(self, sid: str, name: str) -> dict[str, Any]:
        response = self._request("GET", f"/api/jobs/{sid}")
        if response.status_code == 404:
            raise self._not_found(name, response)
        if response.status_code >= 400:
            raise errors.http_error(self.address, response, f"cannot read job {name!r}")
        info: dict[str, Any] = response.json()
        return info

    def _list_raw(self) -> list[dict[str, Any]]:
        response = self._request("GET", "/api/jobs/")
        if response.status_code in (404, 405):
            raise errors.no_job_server(self.address)
        if response.status_code >= 400:
            raise errors.http_error(self.address, response, "cannot list jobs")
        jobs: list[dict[str, Any]] = response.json()
        return jobs

    @staticmethod
    def _dlu_job_name(job: dict[str, Any]) -> str:
        """The DLU job a Ray job launches ('' for probes and other Ray jobs)."""
        metadata: dict[str, Any] = job.get("metadata") or {}
        return "" if metadata.get("dlu_probe") else str(metadata.get("dlu_job") or "")

    def _runs(self, name: str) -> list[dict[str, Any]]:
        """The Ray jobs that launched DLU job `name`, newest first."""
        runs = [job for job in self._list_raw() if self._dlu_job_name(job) == name]
        return sorted(runs, key=lambda job: -float(job.get("start_time") or 0))

    def _sid(self, name: str) -> str:
        runs = self._runs(name)
        if not runs:
            raise JobNotFoundError(f"no job named {name!r} on {self.address}; `dlu list` shows the jobs.")
        return str(runs[0]["submission_id"])

    def _log_text_by_id(self, sid: str, name: str) -> str:
        response = self._request("GET", f"/api/jobs/{sid}/logs")
        if response.status_code == 404:
            raise self._not_found(name, response)
        if response.status_code >= 400:
            raise errors.http_error(self.address, response, f"cannot read the logs of job {name!r}")
        return str(response.json().get("logs", ""))

    def _delete(self, sid: str) -> None:
        try:
            self._request("DELETE", f"/api/jobs/{sid}")
        except ClusterError:
            logger.debug("could not delete Ray job %s", sid)

    # submit ------------------------------------------------------------------------------------
    def submit(self, spec: JobSpec) -> str:
        return self._submit(spec, resume=False)

    def resume(self, spec: JobSpec) -> str:
        return self._submit(spec, resume=True)

    def _submit(self, spec: JobSpec, resume: bool) -> str:
        ensure_valid(spec)
        for run in self._runs(spec.name):  # a finished run leaves the name free
            if str(run.get("status")) not in TERMINAL:
                raise errors.name_taken(spec.name, self.address, str(run.get("status")))
        sid = new_submission_id(spec.name)
        body = {
            "entrypoint": launch_entrypoint(spec, resume, self.workdir),
            "submission_id": sid,
            "metadata": {"dlu_job": spec.name, "dlu_api_version": dlu_api_version()},
        }
        response = self._post_job(body)
        if response.status_code >= 400:
            raise errors.http_error(self.address, response, "the cluster refused the job")
        self._await_acceptance(spec.name, sid)
        return spec.name

    def _await_acceptance(self, name: str, sid: str) -> None:
        """Wait for the launcher's verdict, so a refused job fails `submit` with the reason."""
        if self._accept_timeout <= 0:
            return
        deadline = time.monotonic() + self._accept_timeout
        while time.monotonic() < deadline:
            info = self._job_info_by_id(sid, name)
            log_text = self._log_text_by_id(sid, name)
            if wire.parse_log(log_text).accepted is not None:
                return
            if str(info.get("status")) in TERMINAL:
                raise errors.launch_failure(self.address, name, log_text, str(info.get("message") or ""))
            time.sleep(self._poll)
        logger.warning(
            "job %s: the cluster has not started its launcher within %.0f s; it may be waiting for "
            "resources. Follow it with `dlu status %s`.",
            name,
            self._accept_timeout,
            name,
        )

    def events(self, name: str) -> list[JobEvent]:
        """The timeline of the job's status (a probe asks the PrimeMaster or the state store)."""
        status = self.status(name)  # JobNotFoundError first, as for every other command
        if status.events:
            return list(status.events)
        raise NotSupportedError(
            f"the event timeline of a job on a cluster is not available yet from {self.address}; "
            f"`dlu events --follow {name}` prints the launcher's log, which includes its events"
        )

    # probes ------------------------------------------------------------------------------------
    def _probe(self, name: str, command: str, *extra: str) -> tuple[bool, str]:
        """Run `python -m dlu_prime COMMAND NAME ...` as a short Ray job; (succeeded, its log).

        Raises:
            ClusterSetupError, VersionMismatchError: the cluster cannot run DLU's commands.
        """
        sid = f"{PROBE_PREFIX}{name}-{command}-{uuid.uuid4().hex[:8]}"
        entrypoint = " ".join([_prime_args(command), shlex.quote(name), *map(shlex.quote, extra)])
        body = {
            "entrypoint": entrypoint,
            "submission_id": sid,
            "metadata": {"dlu_probe": command, "dlu_job": name, "dlu_api_version": dlu_api_version()},
        }
        response = self._post_job(body)
        if response.status_code >= 400:
            raise errors.http_error(self.address, response, f"the cluster refused DLU's {command} probe")
        try:
            deadline = time.monotonic() + self._probe_timeout
            while True:
                info = self._job_info_by_id(sid, name)
                ray_status = str(info.get("status"))
                if ray_status in TERMINAL:
                    break
                if time.monotonic() > deadline:
                    self._request("POST", f"/api/jobs/{sid}/stop")
                    raise ClusterError(
                        f"the cluster at {self.address} did not run DLU's {command} probe for "
                        f"{name!r} within {self._probe_timeout:.0f} s; is the head overloaded?"
                    )
                time.sleep(min(self._poll, 0.25))
            log_text = self._log_text_by_id(sid, name)
        finally:
            self._delete(sid)
        if ray_status != "SUCCEEDED":
            failure = errors.launch_failure(self.address, name, log_text)
            if isinstance(failure, VersionMismatchError | ClusterSetupError):
                raise failure
        return ray_status == "SUCCEEDED", log_text

    def _probe_status(self, name: str, info: dict[str, Any]) -> JobStatus | None:
        extra = ["--json"]
        spec = spec_from_entrypoint(str(info.get("entrypoint") or ""))
        if spec is not None and isinstance(spec.get("state_store"), dict):
            extra += ["--store-json", json.dumps(spec["state_store"])]
        ok, log_text = self._probe(name, "status", *extra)
        return wire.parse_log(log_text).status if ok else None

    def debug(
        self, name: str, action: str, role: str, rank: int | None = None, step: int | None = None
    ) -> dict[str, object]:
        """Through a probe job running `python -m dlu_prime debug` next to the PrimeMaster."""
        sid = self._sid(name)  # JobNotFoundError first, as for every other command
        if str(self._job_info_by_id(sid, name).get("status")) in TERMINAL:
            raise JobNotFoundError(f"job {name!r} on {self.address} has stopped")
        extra = [action, role]
        if rank is not None:
            extra += ["--rank", str(rank)]
        if step is not None:
            extra += ["--step", str(step)]
        _, log_text = self._probe(name, "debug", *extra)
        answer = wire.debug_answer(log_text)
        if answer is None:
            raise ClusterError(
                f"the debug probe for {name!r} on {self.address} gave no answer:\n{log_text[-2000:]}"
            )
        if "error" in answer:
            raise DLUError(f"dlu debug {action} on job {name}: {answer['error']}")
        return dict(answer["result"])

    def scale(self, name: str, role: str, size: int) -> dict[str, object]:
        """Through a probe job running `python -m dlu_prime scale` next to the PrimeMaster."""
        sid = self._sid(name)
        if str(self._job_info_by_id(sid, name).get("status")) in TERMINAL:
            raise JobNotFoundError(
                f"job {name!r} on {self.address} has stopped: only a running job can be scaled"
            )
        _, log_text = self._probe(name, "scale", role, str(size))
        answer = wire.debug_answer(log_text)
        if answer is None:
            raise ClusterError(
                f"the scale probe for {name!r} on {self.address} gave no answer:\n{log_text[-2000:]}"
            )
        if "error" in answer:
            raise DLUError(f"dlu scale {name} {role} {size}: {answer['error']}")
        return dict(answer["result"])

    # status ------------------------------------------------------------------------------------
    def status(self, name: str) -> JobStatus:
        return self._status(name, live=True)

    def _status(self, name: str, live: bool) -> JobStatus:
        """From the launcher's log; with `live`, a running job's status comes from a probe."""
        sid = self._sid(name)
        info = self._job_info_by_id(sid, name)
        ray_status = str(info.get("status", "PENDING"))
        log_text = self._log_text_by_id(sid, name)
        report = wire.parse_log(log_text)
        message = str(info.get("message") or "")
        if ray_status in TERMINAL:
            if report.status is not None and report.status.finished:
                return report.status
            exit_code = 0 if ray_status == "SUCCEEDED" else 1
            if report.accepted is None:
                reason = str(errors.launch_failure(self.address, name, log_text, message))
                return JobStatus(name=name, stage=JobStage.STOPPED, exit_code=exit_code, reason=reason)
            base = report.status or JobStatus(name=name, stage=JobStage.STOPPED)
            reason = f"its launcher ended ({ray_status}): {message}".rstrip(": ")
            return base.model_copy(
                update={"stage": JobStage.STOPPED, "exit_code": exit_code, "reason": reason}
            )
        if report.accepted is None:
            return JobStatus(
                name=name, stage=JobStage.PENDING, reason=f"Ray job {ray_status}: the launcher is starting"
            )
        current = self._probe_status(name, info) if live else None
        return current or report.status or JobStatus(name=name, stage=JobStage.INIT)

    def wait(self, name: str, on_update: StatusCallback | None = None) -> JobStatus:
        last: JobStatus | None = None
        while True:
            current = self._status(name, live=False)
            if on_update is not None and current != last:
                on_update(current)
            last = current
            if current.finished:
                return current
            time.sleep(self._poll)

    # stop --------------------------------------------------------------------------------------
    def stop(self, name: str) -> None:
        """Ask the PrimeMaster to stop (its launcher then cleans up and ends); a job whose launcher
        has not started DLU yet is stopped through Ray."""
        sid = self._sid(name)
        info = self._job_info_by_id(sid, name)
        if str(info.get("status")) in TERMINAL:
            return
        if wire.parse_log(self._log_text_by_id(sid, name)).accepted is not None:
            stopped, _ = self._probe(name, "stop")
            if stopped:
                return
        response = self._request("POST", f"/api/jobs/{sid}/stop")
        if response.status_code == 404:
            raise self._not_found(name, response)
        if response.status_code >= 400:
            raise errors.http_error(self.address, response, f"cannot stop job {name!r}")

    def delete(self, name: str) -> None:
        """Delete every Ray job that ran DLU job `name` (its log and record on the cluster)."""
        runs = self._runs(name)
        if not runs:
            raise JobNotFoundError(f"no job named {name!r} on {self.address}; `dlu list` shows the jobs.")
        delete_runs(self.address, name, runs, self._request)

    # logs and list -----------------------------------------------------------------------------
    def logs(
        self, name: str, follow: bool = False, role: str | None = None, rank: int | None = None
    ) -> Iterator[str]:
        """The rank log files, through Ray's dashboard log API (see `dlu_api.client.ray_logs`).
        The run is the one the launcher last reported (its status carries the run id)."""
        sid = self._sid(name)
        status = self._status(name, live=False)
        while follow and not status.run_id and not status.finished:  # the launcher is starting
            time.sleep(self._poll)
            status = self._status(name, live=False)

        def running() -> bool:
            return str(self._job_info_by_id(sid, name).get("status")) not in TERMINAL

        yield from rank_log_lines(self._log_api(), status, role, rank, running if follow else None)

    def tee_lines(
        self, status: JobStatus, wanted: Callable[[RankFile], bool], stop: threading.Event
    ) -> Iterator[str]:
        if status.log_dir or not status.run_id:
            return
        ranks = RemoteRankLogs(self._log_api(), status.name, status.run_id)
        yield from ranks.follow(None, None, lambda: True, wanted, ended=stop)

    def _log_api(self) -> RayLogApi:
        return RayLogApi(self.address, self._request, self._http.stream)

    def timeline(self, name: str, follow: bool = False) -> Iterator[str]:
        """The launcher's log: stages, role states and events as they happen, then the final status.
        Wire lines (for this client) are left out."""
        sid = self._sid(name)

        def finished() -> bool:
            return str(self._job_info_by_id(sid, name).get("status")) in TERMINAL

        yield from wire.follow_log(lambda: self._log_text_by_id(sid, name), finished, follow, self._poll)

    def list_jobs(self) -> list[JobSummary]:
        out: list[tuple[float, JobSummary]] = []
        for job in self._list_raw():
            name = self._dlu_job_name(job)
            if not name:
                continue
            stage = _RAY_TO_STAGE.get(str(job.get("status")), JobStage.PENDING)
            exit_code = {"SUCCEEDED": 0, "FAILED": 1, "STOPPED": 1}.get(str(job.get("status")))
            summary = JobSummary(name=name, stage=stage, exit_code=exit_code, where=self.address)
            out.append((float(job.get("start_time") or 0), summary))
        newest: dict[str, JobSummary] = {}
        for _, summary in sorted(out, key=lambda item: -item[0]):
            newest.setdefault(summary.name, summary)  # earlier runs of a name are history
        return list(newest.values())
