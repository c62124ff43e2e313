"""Local jobs read and steered through their files under `$DLU_HOME/jobs/`, with no Ray: what
`dlu status`, `list`, `stop`, `delete`, `logs`, `debug` and `scale` need of a job that another
process runs (or ran). Importing Ray costs seconds on a loaded machine; none of these pays it.
`dlu_prime.local.LocalJobClient` adds the running of jobs (with an embedded Ray) on top.
"""

from __future__ import annotations

import os
import shutil
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dlu_api.client.base import JobClient, StatusCallback
from dlu_api.client.rank_files import (
    check_selection,
    local_run_dir,
    rank_files,
    read_rank_logs,
    selection_text,
)
from dlu_api.errors import DLUError, JobNameTakenError, JobNotFoundError, JobRunningError, NotSupportedError
from dlu_api.rank_logs import parse_rank_file, select
from dlu_api.status import JobStage, JobStatus, JobSummary
from dlu_api.vocabulary import EventKind
from dlu_prime import job_lock
from dlu_prime.job_files import JobFiles

if TYPE_CHECKING:
    from dlu_api.spec.models import JobSpec

_RESIZE_ENDS = frozenset({EventKind.RESIZE_DONE, EventKind.RESIZE_FAILED})


def resize_in_flight(status: JobStatus, role: str) -> bool:
    """Whether the job's timeline shows a resize of `role` under way: its last resize_started
    is not followed by a resize_done or resize_failed. Pure."""
    if status.stage.is_terminal:
        return False
    for event in reversed(status.events):
        if event.role != role:
            continue
        if event.kind in _RESIZE_ENDS:
            return False
        if event.kind == EventKind.RESIZE_STARTED:
            return True
    return False


STOP_ANSWER_S = 5.0
"""How long `stop` waits for the owner process to take a stop request from its mailbox (it reads
it every half second while it follows the job) before it signals that process instead."""


class LocalRecords(JobClient):
    """Jobs on this machine as their files tell, including those other processes run."""

    def __init__(self) -> None:
        self.files = JobFiles()

    def submit(self, spec: JobSpec) -> str:
        raise NotSupportedError("reading job records runs no job: use dlu_prime.local.LocalJobClient")

    def resume(self, spec: JobSpec) -> str:
        raise NotSupportedError("reading job records runs no job: use dlu_prime.local.LocalJobClient")

    def wait(self, name: str, on_update: StatusCallback | None = None) -> JobStatus:
        raise JobNotFoundError(f"job {name!r} was not submitted by this process")

    def status(self, name: str) -> JobStatus:
        return self.files.status(name)[0]

    def stop(self, name: str) -> None:
        """Ask the process that runs the job to stop it cleanly: through its mailbox first (it
        answers whatever its signal dispositions; a `dlu run` started in the background by a
        non-interactive shell ignores SIGINT), then, with no answer, SIGINT as Ctrl-C would.
        A job already STOPPING gets SIGINT, as a second Ctrl-C: stopped at once. A job that has
        already ended is left as it is.

        Raises:
            JobNotFoundError: no such job, or no process runs it (LOST); or its process could
                not be verified; nothing was signalled then.
        """
        status, owner = self.files.status(name)
        if owner is None:
            if status.stage is JobStage.STOPPED:
                return
            raise JobNotFoundError(
                f"local job {name!r} is not running ({status.stage.value}): {status.reason}"
            )
        if owner == 0:
            raise JobNotFoundError(f"local job {name!r} is just starting; try again in a moment")
        if owner == os.getpid():
            raise JobNotFoundError(f"local job {name!r} runs in this process: stop it with its own client")
        if job_lock.verified_owner(self.files.lock_path(name)) != owner:
            raise JobNotFoundError(
                f"local job {name!r}: process {owner} could not be verified as its owner (the lock "
                f"file {self.files.lock_path(name)} names a pid whose start time differs, or none); "
                "nothing was signalled. If the job's `dlu run` still runs, stop it there with Ctrl-C."
            )
        if status.stage is not JobStage.STOPPING:  # a stop while one runs is a second Ctrl-C
            request = {"action": "stop", "role": "", "rank": None, "step": None}
            try:
                answer = self.files.ask(name, request, timeout_s=STOP_ANSWER_S)
            except JobNotFoundError:
                answer = None  # not following the job (busy, or a program that never waits)
            if answer is not None and "error" not in answer:
                return
        try:
            os.kill(owner, signal.SIGINT)
        except ProcessLookupError:
            raise JobNotFoundError(
                f"local job {name!r} is not running (its process {owner} is gone)"
            ) from None

    def delete(self, name: str) -> None:
        """Remove a stopped or LOST local job's record and its rank logs; one that runs is
        refused, untouched."""
        status, owner = self.files.status(name)
        if owner is not None:
            who = f" in process {owner}" if owner else ""
            raise JobRunningError(
                f"local job {name!r} is running{who} ({status.stage.value}); stop it first with "
                f"`dlu stop {name}`, then delete it"
            )
        try:
            self.files.remove(name)
        except JobNameTakenError:
            raise JobRunningError(
                f"local job {name!r} was started again meanwhile; stop it with `dlu stop {name}` first"
            ) from None
        if status.run_id:
            remove_rank_logs(local_run_dir(status).parent)

    def logs(
        self, name: str, follow: bool = False, role: str | None = None, rank: int | None = None
    ) -> Iterator[str]:
        """The rank log files under the job's log dir (see `dlu_api.rank_logs`)."""
        status = self.status(name)
        while follow and not status.run_id and not self._stopped(name):  # the job is starting
            time.sleep(0.3)
            status = self.status(name)
        run = local_run_dir(status)
        check_selection(status, role, rank)
        if not follow:
            lines = list(read_rank_logs(run, role, rank))
            if not lines and not any(True for _ in select(rank_files(run), role, rank)):
                raise DLUError(f"job {name!r} has no rank logs{selection_text(role, rank)} under {run} yet")
            yield from lines
            return
        yield from read_rank_logs(run, role, rank, follow=lambda: not self._stopped(name))

    def _stopped(self, name: str) -> bool:
        return self.files.status(name)[0].stage.is_terminal

    def debug(
        self, name: str, action: str, role: str, rank: int | None = None, step: int | None = None
    ) -> dict[str, object]:
        answer = self._ask(name, {"action": action, "role": role, "rank": rank, "step": step}, "")
        if "error" in answer:
            raise DLUError(f"dlu debug {action} on job {name}: {answer['error']}")
        return dict(answer["result"])

    def scale(self, name: str, role: str, size: int) -> dict[str, object]:
        """Asked of the process running the job; its answer is waited for as long as the job's
        state shows the resize in flight (a long scale, a PrimeMaster rebuilt meanwhile), not
        a fixed time."""
        request = {"action": "scale", "role": role, "rank": size, "step": None}

        def resizing() -> bool:
            status, owner = self.files.status(name)
            return owner is not None and resize_in_flight(status, role)

        answer = self._ask(name, request, ": only a running job can be scaled", resizing)
        if "error" in answer:
            raise DLUError(f"dlu scale {name} {role} {size}: {answer['error']}")
        return dict(answer["result"])

    def _ask(
        self,
        name: str,
        request: dict[str, Any],
        why: str,
        in_progress: Callable[[], bool] | None = None,
    ) -> dict[str, Any]:
        status, owner = self.files.status(name)
        if owner is None:
            raise JobNotFoundError(f"local job {name!r} is not running ({status.stage.value}){why}")
        return self.files.ask(name, request, in_progress=in_progress)

    def list_jobs(self) -> list[JobSummary]:
        out: list[JobSummary] = []
        for name in self.files.names():
            try:
                status = self.files.status(name)[0]
            except JobNotFoundError:
                continue  # removed meanwhile
            out.append(
                JobSummary(
                    name=name,
                    stage=status.stage,
                    exit_code=status.exit_code,
                    where="local",
                    start_time=status.events[0].time if status.events else None,
                    end_time=status.events[-1].time if status.finished and status.events else None,
                )
            )
        return out


def remove_rank_logs(job_dir: Path) -> None:
    """Remove every run folder of rank logs under a job's log folder (`<logs.dir>/<job>/`), then
    the folder if nothing else is left in it: a folder holding anything but rank logs stays."""
    if not job_dir.is_dir():
        return
    for run in job_dir.iterdir():
        files = [p for p in run.rglob("*") if p.is_file()] if run.is_dir() else [run]
        if run.is_dir() and all(parse_rank_file(str(p)) is not None for p in files):
            shutil.rmtree(run, ignore_errors=True)
    if not any(job_dir.iterdir()):
        job_dir.rmdir()
