"""Running jobs on an embedded Ray in this process: what `dlu run` and `Job.submit()` use.

The embedded Ray lives as long as this process. Each job's latest status is also written to
`$DLU_HOME/jobs/<name>.json` (default `~/.dlu`), so `dlu status`, `dlu list` and `dlu stop`
from another terminal see local jobs too (dlu_prime.job_files). While a job runs, this process
holds its name's lock (dlu_prime.job_lock): a second run of the name on this machine is refused
before anything starts, and once this process is gone its unfinished jobs read as LOST.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from dlu_api.client.base import StatusCallback, refuse_self_submission
from dlu_api.client.rank_files import FileTailer, local_run_dir
from dlu_api.errors import DLUError, JobNotFoundError, JobRunningError
from dlu_api.rank_logs import HOME_SUBDIR, RankFile
from dlu_api.spec.models import JobSpec
from dlu_api.status import JobEvent, JobStage, JobStatus
from dlu_prime import job_lock, launcher, local_metrics, preflight, ray_env, reaper, roles
from dlu_prime.job_files import HOME_ENV, JobFiles, dlu_home
from dlu_prime.local_records import LocalRecords
from dlu_prime.master.lifecycle import EXIT_STOPPED
from dlu_prime.master.state import MAX_EVENTS
from dlu_prime.stop_now import kill_job, killed_status

TEE_POLL_S = 0.2
STOP_REASON = "stopped by user request (`dlu stop`)"
CLOSED_REASON = "stopped: the client that ran it was closed, and its embedded Ray with it"


class LocalJobClient(LocalRecords):
    """Starts an embedded Ray on first use and runs jobs there through the launcher; jobs other
    processes run are read and steered through their files (`LocalRecords`)."""

    def __init__(self, **ray_options: Any) -> None:
        super().__init__()
        self._ray_options = ray_options
        self._address: str | None = None
        self._specs: dict[str, JobSpec] = {}
        self._locks: dict[str, job_lock.JobLock] = {}
        self._last: dict[str, JobStatus] = {}
        self.metrics: local_metrics.LocalEndpoint | None = None

    @property
    def metrics_url(self) -> str | None:
        """Where this process serves its jobs' metrics (Prometheus), once a job started."""
        return self.metrics.url if self.metrics is not None else None

    def _ensure_ray(self) -> None:
        if self._address is None:
            self._address = ray_env.init_local(**self._ray_options)

    def submit(self, spec: JobSpec) -> str:
        return self._submit(spec, resume=False)

    def resume(self, spec: JobSpec) -> str:
        return self._submit(spec, resume=True)

    def _submit(self, spec: JobSpec, resume: bool) -> str:
        """Before Ray or any zygote starts, a job that cannot run here is refused at no cost,
        and so is one whose name another process runs. Rank logs default to $DLU_HOME/logs."""
        refuse_self_submission(spec.name)
        if spec.logs.dir is None:
            logs = spec.logs.model_copy(update={"dir": str(dlu_home() / HOME_SUBDIR)})
            spec = spec.model_copy(update={"logs": logs})
        if self._address is None:
            self._ray_options = preflight.sized_for(spec, self._ray_options)
        preflight.check_local(spec, os.getcwd(), self._ray_options, reuse=True)
        if self._address is None and self.metrics is None:  # before Ray: its workers inherit where to write
            self.metrics = local_metrics.start_endpoint()
        lock = job_lock.take(self.files.lock_path(spec.name), spec.name)
        try:
            if self._address is None:  # the embedded Ray starts here: warm this node up beside it
                roles.warm_up_this_node(spec.roles)
                launcher.prefetch_master()
            self._ensure_ray()
            launcher.submit_job(spec, os.getcwd(), resume, code_checked=True)
        except BaseException:
            lock.release()
            raise
        self._specs[spec.name] = spec
        self._locks[spec.name] = lock
        self._record(JobStatus(name=spec.name, stage=JobStage.INIT))
        return spec.name

    def _record(self, status: JobStatus) -> None:
        self._last[status.name] = status
        self.files.write(status, self._address)

    def _finish(self, final: JobStatus) -> None:
        """Write the job's end, then give its name up (in that order: a reader that finds the
        name free finds the end written), then forget the job. Cut short by an interrupt, it
        can run again: the job is forgotten last, and only the name's owner writes."""
        lock = self._locks.get(final.name)
        if lock is not None and lock.held:
            self._record(final)
            lock.release()
        self._locks.pop(final.name, None)
        self._last.pop(final.name, None)
        self._specs.pop(final.name, None)

    def wait(self, name: str, on_update: StatusCallback | None = None) -> JobStatus:
        spec = self._specs.get(name)
        if spec is None:
            raise JobNotFoundError(f"job {name!r} was not submitted by this process")

        def record(status: JobStatus) -> None:
            self._record(status)
            if on_update is not None:
                on_update(status)

        # Requests from other terminals are answered off this loop: a `dlu scale` waits for its
        # resize, and meanwhile the loop keeps the job's status file (`dlu status`) fresh.
        with ThreadPoolExecutor(max_workers=2, thread_name_prefix=f"dlu-requests-{name}") as pool:
            final = launcher.wait_job(
                spec, record, on_poll=lambda: self.files.serve(name, _answer_debug(name), pool.submit)
            )
        self._finish(final)
        return final

    def stop_now(self, name: str, reason: str = "stopped at once by user request") -> JobStatus:
        """Kill the job's PrimeMaster, actors and placement groups without a clean stop, record
        it STOPPED (exit code 130) and give its name up. A job of another process is only asked
        to stop (as `stop` does)."""
        spec = self._specs.get(name)
        if spec is None:
            return super().stop_now(name, reason)
        final = kill_job(spec, self._last.get(name), reason, EXIT_STOPPED)
        self._finish(final)
        return final

    def status(self, name: str) -> JobStatus:
        if name in self._specs:
            current = launcher.job_status(name, events=MAX_EVENTS)  # followers need every event
            if current is not None:
                return current
        return super().status(name)

    def events(self, name: str) -> list[JobEvent]:
        """The whole timeline while this process runs the job; else the last one saved."""
        if name in self._specs:
            current = launcher.job_status(name, events=MAX_EVENTS)
            if current is not None:
                return list(current.events)
        return list(self.status(name).events)

    def stop(self, name: str) -> None:
        """Stop a local job: one of this process through its PrimeMaster, one of another
        process through that process (`LocalRecords.stop`)."""
        if name in self._specs:
            launcher.stop_job(name)
            return
        super().stop(name)

    def delete(self, name: str) -> None:
        if name in self._specs:
            raise JobRunningError(f"local job {name!r} runs in this process; wait for it or stop it first")
        super().delete(name)

    def tee_lines(
        self, status: JobStatus, wanted: Callable[[RankFile], bool], stop: threading.Event
    ) -> Iterator[str]:
        tailer = FileTailer(local_run_dir(status), wanted)
        while not stop.wait(TEE_POLL_S):
            yield from tailer.poll()
        yield from tailer.flush()

    def _stopped(self, name: str) -> bool:
        if name in self._specs:
            return False  # this process runs it: it has stopped once `wait` returned
        return super()._stopped(name)

    def debug(
        self, name: str, action: str, role: str, rank: int | None = None, step: int | None = None
    ) -> dict[str, object]:
        if name not in self._specs:
            return super().debug(name, action, role, rank, step)
        answer = _answer_debug(name)({"action": action, "role": role, "rank": rank, "step": step})
        if "error" in answer:
            raise DLUError(f"dlu debug {action} on job {name}: {answer['error']}")
        return dict(answer["result"])

    def scale(self, name: str, role: str, size: int) -> dict[str, object]:
        if name not in self._specs:
            return super().scale(name, role, size)
        answer = _answer_debug(name)({"action": "scale", "role": role, "rank": size, "step": None})
        if "error" in answer:
            raise DLUError(f"dlu scale {name} {role} {size}: {answer['error']}")
        return dict(answer["result"])

    def close_at_exit(self) -> bool:
        """Every job of this client has ended (its end recorded, its name given up): the embedded
        Ray is left to end with this process, which may exit at once (True). Ray ties its GCS,
        raylet and log monitor to this process, which the kernel ends with it, and the reaper's
        watcher ends the rest (dlu_prime.reaper); `ray.shutdown()` would instead stop them one
        after another, each given time to exit, while the user waits for the prompt. With a job
        still running here, or no watcher: `close()` (False)."""
        if self._specs or self._address is None or not reaper.watching():
            self.close()
            return False
        self._close_metrics(wait=False)
        return True

    def _close_metrics(self, wait: bool = True) -> None:
        if self.metrics is not None:
            self.metrics.close(wait)
            self.metrics = None

    def close(self) -> None:
        """Shut the embedded Ray down; a job still running here ends with it, recorded STOPPED."""
        import ray

        if self._address is not None and ray.is_initialized():
            ray.shutdown()
        self._address = None
        for name in list(self._specs):
            last = self._last.get(name) or JobStatus(name=name, stage=JobStage.INIT)
            self._finish(killed_status(last, CLOSED_REASON, EXIT_STOPPED))
        self._close_metrics()


def _answer_debug(name: str) -> Callable[[dict[str, Any]], dict[str, Any]]:
    def handle(request: dict[str, Any]) -> dict[str, Any]:
        try:
            if request["action"] == "stop":  # `dlu stop` from another process
                return {"result": {"stopping": launcher.stop_job(name, STOP_REASON)}}
            if request["action"] == "scale":  # the size travels as the rank
                result = launcher.scale_job(name, str(request["role"]), int(request["rank"]))
            else:
                result = launcher.debug_job(
                    name,
                    str(request["action"]),
                    str(request["role"]),
                    request.get("rank"),
                    request.get("step"),
                )
        except (LookupError, ValueError) as exc:
            return {"error": str(exc)}
        return {"result": result}

    return handle


__all__ = ["HOME_ENV", "JobFiles", "LocalJobClient", "dlu_home"]
