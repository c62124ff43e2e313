"""The files of local jobs under `$DLU_HOME/jobs/` (default `~/.dlu`): each job's last status
(`<name>.json`), its name lock (`<name>.lock`, see dlu_prime.job_lock) and a mailbox for
debugging requests (`<name>.debug/`). `dlu status`, `dlu list` and `dlu stop` from another
terminal read them; no Ray is imported here.

A record is only as true as its writer is alive: the running process writes every change, but
a process killed outright writes nothing more. So a reader checks the name's lock too: a job
that is not STOPPED while nobody holds its lock reads as LOST.
"""

from __future__ import annotations

import json
import os
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from dlu_api.errors import JobNotFoundError
from dlu_api.status import JobStage, JobStatus, RoleStatus
from dlu_prime import job_lock

HOME_ENV = "DLU_HOME"
_READS = 5  # a record that changes between reads while nobody holds its lock: judged at the last


def dlu_home() -> Path:
    return Path(os.environ.get(HOME_ENV) or Path.home() / ".dlu")


def current_status(recorded: JobStatus, recorded_pid: int | None, owner: int | None) -> JobStatus:
    """What a record means given who holds the job's lock now (`owner`: its pid, 0 if not
    known yet, None if nobody holds it).

    - nobody holds it: a finished job is what it says; any other is LOST (its process died
      before it could write the end);
    - the process that wrote the record holds it: the record is current;
    - another process holds it: that one is starting the job again and has not written yet.
    """
    if owner is None:
        if recorded.stage.is_terminal:
            return recorded
        who = f"process {recorded_pid}" if recorded_pid else "the process"
        return recorded.model_copy(
            update={
                "stage": JobStage.LOST,
                "reason": f"{who} that ran this job is gone (killed or crashed) before it could "
                f"record the job's end; last seen {recorded.stage.value}. A local job's processes "
                "end with the process that runs it; run the job again to start it anew.",
                "roles": ended_roles(recorded.roles, JobStage.LOST.value),
            }
        )
    if owner == 0 or owner == recorded_pid:
        return recorded
    return JobStatus(name=recorded.name, stage=JobStage.INIT, reason=f"process {owner} is starting it")


def reserve(name: str) -> None:
    """Take the job name's lock now, before anything starts, for the local client of this
    process that submits the job (dlu_api's `connect` calls this for `dlu run`).

    Raises:
        JobNameTakenError: another process runs a job of that name.
    """
    job_lock.reserve(JobFiles().lock_path(name), name)


def ended_roles(roles: list[RoleStatus], stage: str) -> list[RoleStatus]:
    """`roles` with every actor that had not finished (or failed, or stopped) put in `stage`:
    a job that ended lists none as RUNNING."""
    from dlu_api.vocabulary import ActorStage  # here: a `dlu status` of a live job needs no spec models

    ended = {s.value for s in ActorStage if s.is_terminal}
    return [
        role.model_copy(
            update={
                "actors": [
                    a if a.stage in ended else a.model_copy(update={"stage": stage}) for a in role.actors
                ]
            }
        )
        for role in roles
    ]


FOLLOW_CHECK_S = 1.0
"""How often `ask` looks whether the work behind a taken request still goes on (past its timeout)."""
FOLLOW_GRACE_S = 10.0
"""How long `ask` waits for the answer after it last saw that work going on."""


class JobFiles:
    """The per-job files of local runs."""

    def __init__(self, root: Path | None = None) -> None:
        self.root = (root or dlu_home()) / "jobs"

    def path(self, name: str) -> Path:
        return self.root / f"{name}.json"

    def lock_path(self, name: str) -> Path:
        return self.root / f"{name}.lock"

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
        """The record as written.

        Raises:
            JobNotFoundError: no record of that name.
        """
        try:
            return json.loads(self.path(name).read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise JobNotFoundError(f"no local job named {name!r}; `dlu list` shows the known jobs") from None

    def status(self, name: str) -> tuple[JobStatus, int | None]:
        """The job's status as it stands (LOST if its process is gone) and the pid of the
        process that runs it: None if none does, 0 if one does but its pid is not written yet.

        The record is read again after the lock is probed: a job that ended between the first
        read and the probe wrote its end before it let the lock go.

        Raises:
            JobNotFoundError: no record of that name.
        """
        record = self.read(name)
        for _ in range(_READS):
            owner = job_lock.holder(self.lock_path(name))
            if owner is not None:
                status = current_status(_status(record), _pid(record), owner)
                return status, owner
            again = self.read(name)
            if again == record:
                break
            record = again  # it changed meanwhile: judge the new one
        return current_status(_status(record), _pid(record), None), None

    def remove(self, name: str) -> None:
        """Delete the job's record and debugging mailbox, holding its name's lock meanwhile so no
        run of the name can start or be running. The lock file itself stays (see job_lock).

        Raises:
            JobNotFoundError: no record of that name.
            JobNameTakenError: a process runs a job of that name.
        """
        self.read(name)
        lock = job_lock.JobLock.acquire(self.lock_path(name), name)
        try:
            self.path(name).unlink(missing_ok=True)
            box = self._mailbox(name)
            for leftover in box.glob("*") if box.is_dir() else []:
                leftover.unlink(missing_ok=True)
            if box.is_dir():
                box.rmdir()
        finally:
            lock.release()

    # debugging requests for a job run by another process ------------------------------------------
    def _mailbox(self, name: str) -> Path:
        return self.root / f"{name}.debug"

    def ask(
        self,
        name: str,
        request: dict[str, Any],
        timeout_s: float = 60.0,
        in_progress: Callable[[], bool] | None = None,
    ) -> dict[str, Any]:
        """Leave a request for the process running the job and wait for its answer.

        `in_progress`: past `timeout_s`, a request the owner has taken is waited for while this
        says its work still goes on (a `dlu scale` whose resize the job's state shows in
        flight), asked every FOLLOW_CHECK_S and followed by FOLLOW_GRACE_S for the answer.

        Raises:
            JobNotFoundError: nobody answered (the job's `dlu run` is gone or busy).
        """
        box = self._mailbox(name)
        box.mkdir(parents=True, exist_ok=True)
        key = uuid.uuid4().hex
        tmp = box / f"{key}.tmp"
        tmp.write_text(json.dumps(request), encoding="utf-8")
        waiting = box / f"{key}.request.json"
        tmp.replace(waiting)
        answer = box / f"{key}.answer.json"
        started = time.monotonic()
        deadline = started + timeout_s
        checked = float("-inf")
        while True:
            if answer.exists():
                found: dict[str, Any] = json.loads(answer.read_text(encoding="utf-8"))
                answer.unlink(missing_ok=True)
                return found
            now = time.monotonic()
            if now >= deadline:
                taken = not waiting.exists()  # the owner claimed it: it is being answered
                if in_progress is None or not taken or now - checked < FOLLOW_CHECK_S:
                    break
                checked = now
                if not in_progress():
                    break
                deadline = now + FOLLOW_GRACE_S
            time.sleep(0.1)
        waiting.unlink(missing_ok=True)
        raise JobNotFoundError(
            f"local job {name!r} did not answer in {time.monotonic() - started:.0f}s; "
            "is its `dlu run` running?"
        )

    def serve(
        self,
        name: str,
        handle: Callable[[dict[str, Any]], dict[str, Any]],
        run: Callable[[Callable[[], None]], object] | None = None,
    ) -> None:
        """Answer every waiting request (called by the process running the job).

        With `run` (e.g. an executor's `submit`), each request is answered there: a `dlu scale`
        waits for its resize, and the caller's loop (which keeps the job's status file fresh,
        so `dlu status` shows the resize while it runs) must not wait with it. A request is
        claimed first (renamed), so a later call never takes it twice."""
        box = self._mailbox(name)
        if not box.is_dir():
            return
        for request in sorted(box.glob("*.request.json")):
            key = request.name.split(".")[0]
            taken = box / f"{key}.taken.json"
            try:
                request.replace(taken)
            except FileNotFoundError:
                continue  # withdrawn by its asker (timed out)

            def answer_it(key: str = key, taken: Path = taken) -> None:
                try:
                    body: dict[str, Any] = json.loads(taken.read_text(encoding="utf-8"))
                    answer = handle(body)
                except Exception as exc:
                    answer = {"error": f"{type(exc).__name__}: {exc}"}
                taken.unlink(missing_ok=True)
                tmp = box / f"{key}.answer.tmp"
                tmp.write_text(json.dumps(answer), encoding="utf-8")
                tmp.replace(box / f"{key}.answer.json")

            if run is None:
                answer_it()
            else:
                run(answer_it)

    def names(self) -> list[str]:
        if not self.root.is_dir():
            return []
        files = sorted(self.root.glob("*.json"), key=lambda p: p.stat().st_mtime, reverse=True)
        return [p.stem for p in files]


def _status(record: dict[str, Any]) -> JobStatus:
    return JobStatus.model_validate(record["status"])


def _pid(record: dict[str, Any]) -> int | None:
    pid = record.get("pid")
    return int(pid) if isinstance(pid, int) and pid > 0 else None
