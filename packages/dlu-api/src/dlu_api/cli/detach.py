"""`dlu run --no-wait`: start the job, return once it is RUNNING, leave it running.

Remote: the launcher on the cluster already runs apart from the driver, so the driver submits
and watches the status until RUNNING. Local: the job's controller (embedded Ray, PrimeMaster,
the `dlu run` that follows the job) must outlive this command, so it runs as a `dlu run` in a
detached process (its own session, output to `$DLU_HOME/jobs/<name>.detached/console.log`);
this command watches the job's record until that process runs the job and it is RUNNING.
Stopping either is `dlu stop NAME` (locally: a stop request to that process, as Ctrl-C would).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from dlu_api.client.base import JobClient
from dlu_api.errors import JobNotFoundError
from dlu_api.status import JobStage, JobStatus

if TYPE_CHECKING:
    from dlu_api.spec.models import JobSpec

Echo = Callable[[str], None]
_POLL_S = 0.25


def started(status: JobStatus) -> bool:
    """Whether a `--no-wait` run can return: the job runs, or has already ended."""
    return status.stage is JobStage.RUNNING or status.finished


def until_running(
    client: JobClient, name: str, on_update: Callable[[JobStatus], None], poll_s: float = 1.0
) -> JobStatus:
    """Follow a submitted job until it is RUNNING or finished (a remote job)."""
    last: JobStatus | None = None
    while True:
        current = client.status(name)
        if current != last:
            on_update(current)
        last = current
        if started(current):
            return current
        time.sleep(poll_s)


def follow_hint(name: str, address: str | None) -> str:
    where = f" --address {address}" if address else ""
    return (
        f"follow it with `dlu events -f {name}{where}` (its timeline), `dlu logs -f {name}{where}` "
        f"(what its ranks print) or `dlu status {name}{where}`; stop it with `dlu stop {name}{where}`"
    )


def detached_dir(home: Path, name: str) -> Path:
    return home / "jobs" / f"{name}.detached"


def start_local(spec: JobSpec, home: Path, verbose: bool = False) -> tuple[subprocess.Popen[bytes], Path]:
    """Start `dlu run` of `spec` in a detached process; (the process, its console log). Its
    output is a file, so it writes plain lines, no live view; quiet unless `verbose`."""
    folder = detached_dir(home, spec.name)
    folder.mkdir(parents=True, exist_ok=True)
    spec_path = folder / "spec.json"
    spec_path.write_text(spec.model_dump_json(), encoding="utf-8")
    console = folder / "console.log"
    with console.open("wb") as out:
        process = subprocess.Popen(
            [sys.executable, "-c", "from dlu_api.cli import main; main()", "run", str(spec_path)]
            + (["--verbose"] if verbose else []),
            cwd=os.getcwd(),
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # a Ctrl-C or a closed terminal here does not reach it
        )
    return process, console


def wait_local(
    read: Callable[[str], tuple[JobStatus, int | None]],
    name: str,
    process: subprocess.Popen[bytes],
    on_update: Callable[[JobStatus], None],
) -> JobStatus | None:
    """Watch the job's record (`read`: JobFiles.status) until `process` runs it and it is RUNNING
    or finished; None if the process ended first (it refused the job or failed)."""
    last: JobStatus | None = None
    while process.poll() is None:
        try:
            current, owner = read(name)
        except JobNotFoundError:
            current, owner = None, None
        if current is not None and owner == process.pid:
            if current != last:
                on_update(current)
            last = current
            if started(current):
                return current
        time.sleep(_POLL_S)
    try:
        current, owner = read(name)
    except JobNotFoundError:
        return None
    return current if owner is None and last is not None and current.finished else None


def console_tail(console: Path, lines: int = 20) -> str:
    try:
        return "\n".join(console.read_text(encoding="utf-8", errors="replace").splitlines()[-lines:])
    except OSError:
        return ""
