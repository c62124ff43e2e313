"""Running jobs on an embedded Ray in this process: what `dlu run` and `Job.submit()` use.

The embedded Ray lives as long as this process. Each job's latest status is also written to
`$DLU_HOME/jobs/<name>.json` (default `~/.dlu`), so `dlu status`, `dlu list` and `dlu stop`
from another terminal see local jobs too.
"""

from __future__ import annotations

import json
import os
import signal
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from dlu_api.client.base import JobClient, StatusCallback
from dlu_api.errors import DLUError, JobNotFoundError
from dlu_api.spec.models import JobSpec
from dlu_api.status import JobEvent, JobStage, JobStatus, JobSummary
from dlu_prime import launcher, preflight, ray_env, roles
from dlu_prime.master.state import MAX_EVENTS

HOME_ENV = "DLU_HOME"


def dlu_home() -> Path:
    return Path(os.environ.get(HOME_ENV) or Path.home() / ".dlu")


class JobFiles:
    """The per-job status files of local runs."""

    def __init__(self, root: Path | None = None) -> None:
        self.root = (root or dlu_home()) / "jobs"

    def path(self, name: str) -> Path:
        return self.root / f"{name}.json"

    def write(self, status: JobStatus, ray_address: str | None) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        record = {
            "status": status.model_dump(mode="json"),
            "ray_address": ray_address,
            "pid": os.getpid(),
        }
        tmp = self.path(status.name).with_suffix(".tmp")
        tmp.write_text(json.dumps(record), encoding="utf-8")
        tmp.replace(self.path(status.name))

    def read(self, name: str) -> dict[str, Any]:
        try:
            return json.loads(self.path(name).read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise JobNotFoundError(f"no local job named {name!r}; `dlu list` shows the known jobs") from None

    # debugging requests for a job run by another `dlu run` process --------------------------------
    def _mailbox(self, name: str) -> Path:
        return self.root / f"{name}.debug"

    def ask(self, name: str, request: dict[str, Any], timeout_s: float = 60.0) -> dict[str, Any]:
        """Leave a request for the process running the job and wait for its answer.

        Raises:
            JobNotFoundError: nobody answered (the job's `dlu run` is gone or busy).
        """
        box = self._mailbox(name)
        box.mkdir(parents=True, exist_ok=True)
        key = uuid.uuid4().hex
        tmp = box / f"{key}.tmp"
        tmp.write_text(json.dumps(request), encoding="utf-8")
        tmp.replace(box / f"{key}.request.json")
        answer = box / f"{key}.answer.json"
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if answer.exists():
                found: dict[str, Any] = json.loads(answer.read_text(encoding="utf-8"))
                answer.unlink(missing_ok=True)
                return found
            time.sleep(0.1)
        (box / f"{key}.request.json").unlink(missing_ok=True)
        raise JobNotFoundError(
            f"local job {name!r} did not answer in {timeout_s:.0f}s; is its `dlu run` running?"
        )

    def serve(self, name: str, handle: Callable[[dict[str, Any]], dict[str, Any]]) -> None:
        """Answer every waiting request (called by the process running the job)."""
        box = self._mailbox(name)
        if not box.is_dir():
            return
        for request in sorted(box.glob("*.request.json")):
            key = request.name.split(".")[0]
            try:
                body: dict[str, Any] = json.loads(request.read_text(encoding="utf-8"))
                answer = handle(body)
            except Exception as exc:
                answer = {"error": f"{type(exc).__name__}: {exc}"}
            request.unlink(missing_ok=True)
            tmp = box / f"{key}.answer.tmp"
            tmp.write_text(json.dumps(answer), encoding="utf-8")
            tmp.replace(box / f"{key}.answer.json")

    def names(self) -> list[str]:
        if not self.root.is_dir():
            return []
        files = sorted(self.root.glob("*.json"), key=lambda p: p.stat().st_mtime, reverse=True)
        return [p.stem for p in files]


class LocalJobClient(JobClient):
    """Starts an embedded Ray on first use and runs jobs there through the launcher."""

    def __init__(self, **ray_options: Any) -> None:
        self._ray_options = ray_options
        self._address: str | None = None
        self._specs: dict[str, JobSpec] = {}
        self.files = JobFiles()

    def _ensure_ray(self) -> None:
        if self._address is None:
            self._address = ray_env.init_local(**self._ray_options)

    def submit(self, spec: JobSpec) -> str:
        return self._submit(spec, resume=False)

    def resume(self, spec: JobSpec) -> str:
        return self._submit(spec, resume=True)

    def _submit(self, spec: JobSpec, resume: bool) -> str:
        # Before Ray or any zygote starts: a job that cannot run here is refused at no cost.
        preflight.check_local(spec, os.getcwd(), self._ray_options)
        if self._address is None:  # the embedded Ray starts here: warm this node up beside it
            roles.warm_up_this_node(spec.roles)
        self._ensure_ray()
        launcher.submit_job(spec, os.getcwd(), resume)
        self._specs[spec.name] = spec
        self.files.write(JobStatus(name=spec.name, stage=JobStage.INIT), self._address)
        return spec.name

    def wait(self, name: str, on_update: StatusCallback | None = None) -> JobStatus:
        spec = self._specs.get(name)
        if spec is None:
            raise JobNotFoundError(f"job {name!r} was not submitted by this process")

        def record(status: JobStatus) -> None:
            self.files.write(status, self._address)
            if on_update is not None:
                on_update(status)

        final = launcher.wait_job(spec, record, on_poll=lambda: self.files.serve(name, _answer_debug(name)))
        self.files.write(final, self._address)
        self._specs.pop(name, None)
        return final

    def status(self, name: str) -> JobStatus:
        if name in self._specs:
            current = launcher.job_status(name)
            if current is not None:
                return current
        return JobStatus.model_validate(self.files.read(name)["status"])

    def events(self, name: str) -> list[JobEvent]:
        """The whole timeline while this process runs the job; else the last one saved."""
        if name in self._specs:
            current = launcher.job_status(name, events=MAX_EVENTS)
            if current is not None:
                return list(current.events)
        return list(self.status(name).events)

    def stop(self, name: str) -> None:
        """Stop a local job. One run by another `dlu run` process is stopped the way Ctrl-C does:
        that process gets SIGINT, stops the job cleanly and exits with 130."""
        if name in self._specs:
            launcher.stop_job(name)
            return
        record = self.files.read(name)
        if JobStatus.model_validate(record["status"]).stage is JobStage.STOPPED:
            return
        pid = int(record.get("pid") or 0)
        try:
            if pid <= 0:
                raise ProcessLookupError(pid)
            os.kill(pid, signal.SIGINT)
        except ProcessLookupError:
            raise JobNotFoundError(
                f"local job {name!r} is not running (its `dlu run` process is gone)"
            ) from None

    def logs(self, name: str, follow: bool = False) -> Iterator[str]:
        """The job's event timeline (worker output itself is printed by the `dlu run` that runs it)."""
        seen = 0
        while True:
            status = self.status(name)
            for event in status.events[seen:]:
                where = "/".join(p for p in (event.role, event.actor) if p)
                stamp = time.strftime("%H:%M:%S", time.localtime(event.time))
                yield f"{stamp} {event.kind} {where + ': ' if where else ''}{event.message}"
            seen = len(status.events)
            if not follow or status.stage is JobStage.STOPPED:
                if status.stage is JobStage.STOPPED and status.reason:
                    yield f"stopped: exit code {status.exit_code}: {status.reason}"
                return
            time.sleep(1.0)

    def debug(
        self, name: str, action: str, role: str, rank: int | None = None, step: int | None = None
    ) -> dict[str, object]:
        if name in self._specs:
            answer = _answer_debug(name)({"action": action, "role": role, "rank": rank, "step": step})
        else:
            record = self.files.read(name)
            if JobStatus.model_validate(record["status"]).stage is JobStage.STOPPED:
                raise JobNotFoundError(f"local job {name!r} has stopped")
            answer = self.files.ask(name, {"action": action, "role": role, "rank": rank, "step": step})
        if "error" in answer:
            raise DLUError(f"dlu debug {action} on job {name}: {answer['error']}")
        return dict(answer["result"])

    def list_jobs(self) -> list[JobSummary]:
        out: list[JobSummary] = []
        for name in self.files.names():
            status = JobStatus.model_validate(self.files.read(name)["status"])
            out.append(JobSummary(name=name, stage=status.stage, exit_code=status.exit_code, where="local"))
        return out

    def close(self) -> None:
        import ray

        if self._address is not None and ray.is_initialized():
            ray.shutdown()
        self._address = None


def _answer_debug(name: str) -> Callable[[dict[str, Any]], dict[str, Any]]:
    def handle(request: dict[str, Any]) -> dict[str, Any]:
        try:
            result = launcher.debug_job(
                name, str(request["action"]), str(request["role"]), request.get("rank"), request.get("step")
            )
        except (LookupError, ValueError) as exc:
            return {"error": str(exc)}
        return {"result": result}

    return handle
