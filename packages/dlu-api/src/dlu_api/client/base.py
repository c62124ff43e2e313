"""The client surface every way of running a job implements: local embedded Ray or a cluster."""

from __future__ import annotations

import os
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

from dlu_api.errors import ClusterError, NotSupportedError, SubmittedFromItselfError
from dlu_api.rank_logs import RankFile
from dlu_api.status import EventCursor, JobEvent, JobStatus, JobSummary

if TYPE_CHECKING:  # the spec models cost a `dlu status` 0.2-0.4 s to build
    from dlu_api.spec.models import JobSpec

StatusCallback = Callable[[JobStatus], None]


JOB_ENV, ACTOR_ENV = "DLU_JOB", "DLU_ACTOR"
"""Set in every actor and training process of a job (its name, the actor's name)."""


def refuse_self_submission(job: str) -> None:
    """Refuse a job submitted from inside one of its own processes, before anything is asked.

    DLU imports the module an entrypoint names in the role's actor (its self check) and in each
    training process; a module that starts the job when imported would otherwise submit it again
    there and get "already running, stop it or rename", which points at the wrong fix.

    Raises:
        SubmittedFromItselfError: this process is an actor or training process of `job`.
    """
    actor = os.environ.get(ACTOR_ENV)
    if not actor or os.environ.get(JOB_ENV) != job:
        return
    raise SubmittedFromItselfError(
        f"job {job!r} was submitted from inside its own actor {actor}: a module one of its "
        "entrypoints names starts the job when it is imported, and DLU imports that module to run "
        "the entrypoint. Put the code that starts the job (`Job(spec).run()`, `.submit()`) under "
        '`if __name__ == "__main__":`, or move the entrypoint functions to a module of their own.'
    )


class JobClient(ABC):
    """Submit, watch and stop DLU jobs.

    Implementations raise `dlu_api.errors.DLUError` subclasses with messages meant for users.
    """

    @abstractmethod
    def submit(self, spec: JobSpec) -> str:
        """Start the job and return its name without waiting for it.

        Raises:
            SpecError: the spec breaks a rule (nothing was started).
            ClusterError: the cluster refused or could not be reached.
        """

    @abstractmethod
    def resume(self, spec: JobSpec) -> str:
        """Start a stored job again (a job-level restart, possibly on a new Ray cluster) from its
        state store, keeping its counters, budgets and timeline; return its name.

        Raises:
            SpecError: nothing to resume, the job already succeeded, or a limit is used up.
        """

    @abstractmethod
    def wait(self, name: str, on_update: StatusCallback | None = None) -> JobStatus:
        """Block until the job has stopped; `on_update` sees every changed status.

        Raises:
            JobNotFoundError: no such job.
        """

    @abstractmethod
    def status(self, name: str) -> JobStatus:
        """The job's current status.

        Raises:
            JobNotFoundError: no such job.
        """

    @abstractmethod
    def stop(self, name: str) -> None:
        """Ask the job to stop; returns once the request is accepted.

        Raises:
            JobNotFoundError: no such job.
        """

    def stop_now(self, name: str, reason: str = "stopped at once by user request") -> JobStatus:
        """Stop the job without waiting for a clean stop (a second Ctrl-C): what this client can
        kill at once it kills, and the job's status afterwards is returned. This default only
        asks for a stop (as `stop`) and returns the status as it is then; the local client
        kills the job's actors and returns it STOPPED.

        Raises:
            JobNotFoundError: no such job.
        """
        del reason
        self.stop(name)
        return self.status(name)

    @abstractmethod
    def logs(
        self, name: str, follow: bool = False, role: str | None = None, rank: int | None = None
    ) -> Iterator[str]:
        """What the job's ranks wrote to stdout and stderr (their rank log files), each line
        prefixed `[role/rankN]` (`[role/rankN:err]` for stderr); only `role` and `rank` when
        given. With `follow`, keeps yielding new lines until the job stops.

        Raises:
            JobNotFoundError: no such job.
            DLUError: the job has no rank logs to read (yet), or none of that role and rank.
        """

    def tee_lines(
        self, status: JobStatus, wanted: Callable[[RankFile], bool], stop: threading.Event
    ) -> Iterator[str]:
        """New lines of the `wanted` rank files of `status`'s run, prefixed, until `stop` is set
        (then what was still unread): what `dlu run` prints for `logs.tee`.

        Raises:
            NotSupportedError: this client cannot follow rank files.
        """
        del status, wanted, stop
        raise NotSupportedError(f"{type(self).__name__} cannot follow rank logs")

    def timeline(self, name: str, follow: bool = False) -> Iterator[str]:
        """The job's event timeline as readable lines; with `follow`, until the job stops.

        Raises:
            JobNotFoundError: no such job.
        """
        cursor = EventCursor()
        while True:
            status = self.status(name)
            for event in cursor.take(status.events):
                where = "/".join(p for p in (event.role, event.actor) if p)
                stamp = time.strftime("%H:%M:%S", time.localtime(event.time))
                yield f"{stamp} {event.kind} {where + ': ' if where else ''}{event.message}"
            if not follow or status.stage.is_terminal:
                if status.stage.is_terminal and status.reason:
                    code = "" if status.exit_code is None else f": exit code {status.exit_code}"
                    yield f"{status.stage.value.lower()}{code}: {status.reason}"
                return
            time.sleep(1.0)

    def events(self, name: str) -> list[JobEvent]:
        """The job's event timeline, oldest first (bounded by the PrimeMaster's MAX_EVENTS).

        The default reads the events of `status`; clients that can fetch the whole timeline
        override it.

        Raises:
            JobNotFoundError: no such job.
            NotSupportedError: this client cannot read timelines.
        """
        return list(self.status(name).events)

    @abstractmethod
    def list_jobs(self) -> list[JobSummary]:
        """Jobs this client can see, newest first."""

    def debug(
        self, name: str, action: str, role: str, rank: int | None = None, step: int | None = None
    ) -> dict[str, object]:
        """The health seed's debugging endpoints, through the job's PrimeMaster: `mark_unhealthy`
        (the workers report an error, so a recovery runs), `get_step`, `set_step`.

        Raises:
            JobNotFoundError: no such running job.
            ClusterError: this client cannot reach the job's PrimeMaster.
        """
        raise ClusterError(f"{type(self).__name__} does not support `dlu debug` yet")

    def scale(self, name: str, role: str, size: int) -> dict[str, object]:
        """Set a simple role's actor count, or an elastic role's node count (`dlu scale`); waits
        for the resize to end. The answer
        has old_size, new_size, done, failed and the resize event's message.

        Raises:
            JobNotFoundError: no such running job.
            DLUError: refused (the message names the value and the fix); the job is untouched.
        """
        raise ClusterError(f"{type(self).__name__} does not support `dlu scale` yet")

    def delete(self, name: str) -> None:
        """Remove the record of a job that has stopped (finished, failed, stopped or LOST).

        Raises:
            JobNotFoundError: no such job.
            JobRunningError: the job still runs; nothing is removed.
            NotSupportedError: this client cannot delete jobs.
        """
        raise NotSupportedError(f"{type(self).__name__} cannot delete jobs")

    def close(self) -> None:
        """Release what the client holds (an embedded Ray, connections). Safe to call twice."""
        return None

    def close_at_exit(self) -> bool:
        """Close as this process is about to end (`dlu run` once its job has ended).

        Returns whether the process may end at once, skipping its own teardown: True only where
        what the client still holds ends with the process anyway and nothing is lost by not
        waiting for it (the local client's embedded Ray); the default closes and says False.
        """
        self.close()
        return False

    def run(self, spec: JobSpec, on_update: StatusCallback | None = None) -> JobStatus:
        """Submit and wait."""
        return self.wait(self.submit(spec), on_update)
