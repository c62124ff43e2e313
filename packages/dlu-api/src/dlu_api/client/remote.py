"""Jobs on a Ray cluster through the Ray Jobs REST API; needs only an HTTP client.

The job's entrypoint is the dlu-prime launcher, given the same JSON spec a local run uses.
A driver cannot call the PrimeMaster from here (that needs Ray), so everything DLU-specific
goes through the launcher's Ray job: its log, and its mailbox (`dlu_api.client.wire`):

- `submit` uploads a local working directory (`remote_upload`), then waits until the launcher
  reports the job accepted, or turns its failure into a plain error (bad spec on the cluster,
  name taken, dlu-prime missing, version mismatch);
- `status` and `events` read what the launcher keeps publishing in its log (`remote_status`):
  one or two HTTP requests, no Ray job; `wait` and `timeline(follow=True)` follow the log
  with a `LauncherFeed`, which reads each byte once however long the job runs;
- `stop`, `debug` and `scale` leave a request in the job's mailbox and read the launcher's
  answer in its log (`remote_mail`).

What a run is submitted as (its entrypoint, submission id, working directory, auth token) is
`remote_launch`; this module is the client.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx

from dlu_api.client import remote_errors as errors
from dlu_api.client import remote_mail, remote_status, remote_upload, wire
from dlu_api.client.base import JobClient, StatusCallback, refuse_self_submission
from dlu_api.client.launcher_feed import (
    LauncherFeed,
    driver_log,
    follow_human_lines,
    followed_status,
    launcher_accepted,
    open_feed,
)
from dlu_api.client.ray_logs import RayLogApi, RemoteRankLogs, rank_log_lines
from dlu_api.client.remote_delete import delete_runs
from dlu_api.client.remote_launch import (
    LAUNCH_COMMAND,
    dlu_api_version,
    find_token,
    launch_entrypoint,
    new_submission_id,
    working_dir,
)
from dlu_api.client.remote_status import TERMINAL
from dlu_api.errors import DLUError, JobNotFoundError
from dlu_api.rank_logs import RankFile
from dlu_api.spec.models import JobSpec
from dlu_api.spec.rules import ensure_valid
from dlu_api.status import JobEvent, JobStatus, JobSummary

logger = logging.getLogger(__name__)

# The launch helpers callers import from here (their home is `remote_launch`).
__all__ = ["LAUNCH_COMMAND", "RemoteJobClient", "dlu_api_version", "find_token", "working_dir"]


class RemoteJobClient(JobClient):
    """Talks to a Ray head's job server (the dashboard port, 8265 by default).

    Args:
        workdir: the job's code: a directory on this machine (uploaded, as
            `ray job submit --working-dir` does), a URI Ray can fetch, or `cluster:/path` (or a
            path this machine lacks) on the cluster's nodes; default: where Ray runs entrypoints.
        accept_timeout_s: how long `submit` waits for the launcher to accept the job; 0: no wait.
        request_timeout_s: how long `stop`/`debug` wait for the launcher's answer (`scale`
            waits for its resize besides).
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
        request_timeout_s: float = 60.0,
        token: str | None = None,
    ) -> None:
        self.address = address.rstrip("/")
        self.workdir = workdir
        self._poll = poll_interval_s
        self._accept_timeout = accept_timeout_s
        self._request_timeout = request_timeout_s
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
        """The DLU job a Ray job launches ('' for other Ray jobs, and the probes of older drivers)."""
        metadata: dict[str, Any] = job.get("metadata") or {}
        return "" if metadata.get("dlu_probe") else str(metadata.get("dlu_job") or "")

    def _runs(self, name: str) -> list[dict[str, Any]]:
        """The Ray jobs that launched DLU job `name`, newest first."""
        runs = [job for job in self._list_raw() if self._dlu_job_name(job) == name]
        return sorted(runs, key=lambda job: -float(job.get("start_time") or 0))

    def _sid(self, name: str) -> str:
        """The Ray job of the newest run of `name`."""
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

    # submit ------------------------------------------------------------------------------------
    def submit(self, spec: JobSpec) -> str:
        return self._submit(spec, resume=False)

    def resume(self, spec: JobSpec) -> str:
        return self._submit(spec, resume=True)

    def _submit(self, spec: JobSpec, resume: bool) -> str:
        ensure_valid(spec)
        refuse_self_submission(spec.name)
        cluster_dir, runtime_dir = working_dir(self.workdir)
        if runtime_dir is not None and "://" not in runtime_dir:
            remote_upload.package(Path(runtime_dir).expanduser())  # too big: refused before any request
        for run in self._runs(spec.name):  # a finished run leaves the name free
            if str(run.get("status")) not in TERMINAL and not self._reported_end(run, spec.name):
                raise errors.name_taken(spec.name, self.address, str(run.get("status")))
        body: dict[str, Any] = {
            "entrypoint": launch_entrypoint(spec, resume, cluster_dir),
            "submission_id": new_submission_id(spec.name),
            "metadata": {"dlu_job": spec.name, "dlu_api_version": dlu_api_version()},
        }
        if runtime_dir is not None:
            uri = runtime_dir
            if "://" not in runtime_dir:
                uri = remote_upload.upload(self._request, self.address, Path(runtime_dir).expanduser())
                logger.info("job %s: uploaded %s as %s", spec.name, runtime_dir, uri)
            body["runtime_env"] = {"working_dir": uri}
        response = self._post_job(body)
        if response.status_code >= 400:
            raise errors.http_error(self.address, response, "the cluster refused the job")
        self._await_acceptance(spec.name, str(body["submission_id"]))
        return spec.name

    def _reported_end(self, run: dict[str, Any], name: str) -> bool:
        """Whether a run's launcher has written the job's end (it is exiting: the name is free)."""
        current = wire.parse_log(self._log_text_by_id(str(run["submission_id"]), name)).current
        return current is not None and current.finished

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
            time.sleep(min(self._poll, 0.25))
        logger.warning(
            "job %s: the cluster has not started its launcher within %.0f s; it may be waiting for "
            "resources. Follow it with `dlu status %s`.",
            name,
            self._accept_timeout,
            name,
        )

    # status, events ----------------------------------------------------------------------------
    def status(self, name: str) -> JobStatus:
        """What the launcher last published: three requests (job list, job, log), no Ray job."""
        sid = self._sid(name)
        info = self._job_info_by_id(sid, name)
        return remote_status.status_from(name, self.address, info, self._log_text_by_id(sid, name))

    def events(self, name: str) -> list[JobEvent]:
        """The whole timeline: every event the launcher wrote to its log."""
        return list(self.status(name).events)

    def wait(self, name: str, on_update: StatusCallback | None = None) -> JobStatus:
        """Follows the launcher's log with a `LauncherFeed` (each byte read once); a cluster
        without Ray's log API has its whole log read every poll."""
        sid = self._sid(name)
        feed: LauncherFeed | None = None
        tried = False
        last: JobStatus | None = None
        try:
            while True:
                info = self._job_info_by_id(sid, name)
                if not tried and driver_log(sid, info) is not None:  # once its entrypoint started
                    tried, feed = True, open_feed(self._log_api(), sid, info)
                current = followed_status(
                    name, self.address, info, feed, lambda: self._log_text_by_id(sid, name)
                )
                if on_update is not None and current != last:
                    on_update(current)
                last = current
                if current.finished:
                    return current
                time.sleep(self._poll)
        finally:
            if feed is not None:
                feed.close()

    # requests through the mailbox --------------------------------------------------------------
    def _ask(
        self, name: str, body: dict[str, Any], what: str, timeout_s: float | None = None
    ) -> dict[str, Any]:
        """Leave a request for the running job's launcher and return its answer.

        Raises:
            JobNotFoundError: no such job, or it is not running.
            ClusterSetupError: its launcher reads no requests (an older dlu-prime).
        """
        sid = self._sid(name)
        info = self._job_info_by_id(sid, name)
        if str(info.get("status")) in TERMINAL:
            raise JobNotFoundError(f"job {name!r} on {self.address} has stopped: {what} needs a running job")
        accepted = launcher_accepted(self._log_api(), sid, info, lambda: self._log_text_by_id(sid, name))
        if accepted is None:
            raise JobNotFoundError(
                f"job {name!r} on {self.address} has not started yet ({info.get('status')}); try again in a moment"
            )
        remote_mail.check_supported(self.address, accepted)
        return self._leave_request(name, sid, info, body, timeout_s or self._request_timeout)

    def _leave_request(
        self, name: str, sid: str, info: dict[str, Any], body: dict[str, Any], timeout_s: float
    ) -> dict[str, Any]:
        """Through the mailbox, the answer read from a feed of the log opened before the request
        is left (only what the launcher appends is read)."""
        feed = open_feed(self._log_api(), sid, info, tail_lines=1)
        try:
            return remote_mail.ask(self._request, self.address, name, sid, body, timeout_s, feed=feed)
        finally:
            if feed is not None:
                feed.close()

    def debug(
        self, name: str, action: str, role: str, rank: int | None = None, step: int | None = None
    ) -> dict[str, object]:
        """Through the job's mailbox; the launcher calls the PrimeMaster."""
        answer = self._ask(name, {"action": action, "role": role, "rank": rank, "step": step}, "dlu debug")
        if "error" in answer:
            raise DLUError(f"dlu debug {action} on job {name}: {answer['error']}")
        return dict(answer["result"])

    def scale(self, name: str, role: str, size: int) -> dict[str, object]:
        """Through the job's mailbox; the launcher waits for the resize (up to 45 s)."""
        answer = self._ask(
            name, {"action": "scale", "role": role, "size": size}, "dlu scale", self._request_timeout + 60
        )
        if "error" in answer:
            raise DLUError(f"dlu scale {name} {role} {size}: {answer['error']}")
        return dict(answer["result"])

    def stop(self, name: str) -> None:
        """Ask the PrimeMaster to stop through the job's mailbox (the launcher then cleans up and
        ends); a job whose launcher has not started DLU yet is stopped through Ray."""
        sid = self._sid(name)
        info = self._job_info_by_id(sid, name)
        if str(info.get("status")) in TERMINAL:
            return
        accepted = launcher_accepted(self._log_api(), sid, info, lambda: self._log_text_by_id(sid, name))
        if accepted is not None and accepted.get(wire.MAILBOX):
            try:
                answer = self._leave_request(name, sid, info, {"action": "stop"}, self._request_timeout)
            except JobNotFoundError:
                return  # it ended meanwhile
            if answer.get("result", {}).get("stopped"):
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
        status = self.status(name)
        while follow and not status.run_id and not status.finished:  # the launcher is starting
            time.sleep(self._poll)
            status = self.status(name)

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
        looked = [self._job_info_by_id(sid, name)] if follow else []  # where its log is

        def finished() -> bool:  # the record just read answers the first look
            info = looked.pop() if looked else self._job_info_by_id(sid, name)
            return str(info.get("status")) in TERMINAL

        feed = open_feed(self._log_api(), sid, looked[0]) if looked else None
        if feed is None:
            yield from wire.follow_log(lambda: self._log_text_by_id(sid, name), finished, follow, self._poll)
            return
        try:
            yield from follow_human_lines(feed, finished, self._poll)
        finally:
            feed.close()

    def list_jobs(self) -> list[JobSummary]:
        """The newest run of every DLU job; exit codes by the rule `dlu status` uses."""
        out: list[tuple[float, JobSummary]] = []
        for job in self._list_raw():
            name = self._dlu_job_name(job)
            if name:
                out.append(
                    (float(job.get("start_time") or 0), remote_status.summary(job, name, self.address))
                )
        newest: dict[str, JobSummary] = {}
        for _, summary in sorted(out, key=lambda item: -item[0]):
            newest.setdefault(summary.name, summary)  # earlier runs of a name are history
        return list(newest.values())
