"""`dlu` commands on a job that exists: status, events, stop, delete, logs, debug, scale, list.

Registered on the one `dlu` app (`dlu_api.cli.shared.app`) when `dlu_api.cli` imports this module.
"""

from __future__ import annotations

import json
import time
from typing import Annotated

import typer

from dlu_api.cli.render import jobs_table, status_text
from dlu_api.cli.shared import AddressOpt, app, fail
from dlu_api.client import JobClient, connect_existing
from dlu_api.errors import DLUError
from dlu_api.status import JobStage, JobStatus

STOP_WAIT_S = 60.0
_STOP_POLL_S = 0.5


@app.command()
def status(
    job: Annotated[str, typer.Argument(help="Job name.")],
    address: AddressOpt = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the status as JSON.")] = False,
    events: Annotated[int, typer.Option(help="How many recent events to show.")] = 10,
) -> None:
    """Stage, roles, restart counts and recent events of a job."""
    try:
        current = connect_existing(address).status(job)
    except DLUError as exc:
        raise fail(str(exc)) from None
    typer.echo(current.model_dump_json(indent=2) if as_json else status_text(current, events))


@app.command()
def events(
    job: Annotated[str, typer.Argument(help="Job name.")],
    address: AddressOpt = None,
    follow: Annotated[
        bool,
        typer.Option(
            "--follow", "-f", help="Print the timeline as readable lines as it grows, until the job stops."
        ),
    ] = False,
) -> None:
    """Print a job's event timeline as JSON lines, one event per line, oldest first."""
    try:
        if follow:
            for line in connect_existing(address).timeline(job, follow=True):
                typer.echo(line)
            return
        timeline = connect_existing(address).events(job)
    except DLUError as exc:
        raise fail(str(exc)) from None
    for event in timeline:
        typer.echo(event.model_dump_json())


@app.command()
def stop(
    job: Annotated[str, typer.Argument(help="Job name.")],
    address: AddressOpt = None,
    timeout: Annotated[
        float, typer.Option("--timeout", help="Seconds to wait for the job to have stopped.")
    ] = STOP_WAIT_S,
) -> None:
    """Stop a job cleanly (its actors and placement groups are removed) and wait until it has
    stopped; exits 1 if it has not within --timeout seconds. A stopped job is left as it is."""
    try:
        client = connect_existing(address)
        current = client.status(job)
        if current.stage is JobStage.LOST:  # its processes are gone: nothing to stop
            raise DLUError(f"job {job} is not running (LOST): {current.reason}")
        if current.finished:
            typer.echo(f"job {job} is already stopped: {_ended(current)}")
            return
        client.stop(job)
        typer.echo(f"stopping job {job} (was {current.stage.value}) ...")
        final = _until_stopped(client, job, timeout)
    except DLUError as exc:
        raise fail(str(exc)) from None
    if final.finished:
        typer.echo(f"job {job} stopped: {_ended(final)}")
        return
    moved = "is still STOPPING" if final.stage.value == "STOPPING" else f"is still {final.stage.value}"
    raise fail(
        f"job {job} {moved} after {timeout:.0f}s; `dlu status {job}` shows where it is, and "
        f"`dlu stop {job}` asks again",
        code=1,
    )


def _until_stopped(client: JobClient, job: str, timeout_s: float) -> JobStatus:
    deadline = time.monotonic() + timeout_s
    current = client.status(job)
    while not current.finished and time.monotonic() < deadline:
        time.sleep(_STOP_POLL_S)
        current = client.status(job)
    return current


def _ended(status: JobStatus) -> str:
    code = "" if status.exit_code is None else f" (exit code {status.exit_code})"
    reason = f": {status.reason}" if status.reason else ""
    return f"{status.stage.value}{code}{reason}"


@app.command()
def delete(job: Annotated[str, typer.Argument(help="Job name.")], address: AddressOpt = None) -> None:
    """Remove a stopped or LOST job's record (a running one is refused: stop it first)."""
    try:
        connect_existing(address).delete(job)
    except DLUError as exc:
        raise fail(str(exc)) from None
    typer.echo(f"deleted {job}")


@app.command()
def logs(
    job: Annotated[str, typer.Argument(help="Job name.")],
    address: AddressOpt = None,
    role: Annotated[str | None, typer.Option("--role", "-r", help="Only this role's ranks.")] = None,
    rank: Annotated[
        int | None, typer.Option("--rank", help="Only this rank (of each role, or of --role).")
    ] = None,
    follow: Annotated[
        bool, typer.Option("--follow", "-f", help="Keep printing new lines until the job stops.")
    ] = False,
) -> None:
    """Print what a job's ranks wrote to stdout and stderr, each line prefixed [role/rankN]
    ([role/rankN:err] for stderr). `dlu events` prints the job's timeline."""
    try:
        for line in connect_existing(address).logs(job, follow, role=role, rank=rank):
            typer.echo(line)
    except DLUError as exc:
        raise fail(str(exc)) from None


DEBUG_ACTIONS = {"mark-unhealthy": "mark_unhealthy", "get-step": "get_step", "set-step": "set_step"}


@app.command()
def debug(
    job: Annotated[str, typer.Argument(help="Job name.")],
    action: Annotated[str, typer.Argument(help="mark-unhealthy, get-step or set-step.")],
    role: Annotated[str, typer.Argument(help="Role name.")],
    rank: Annotated[int | None, typer.Option(help="One rank of the role; unset: every rank.")] = None,
    step: Annotated[int | None, typer.Option(help="The step for set-step.")] = None,
    address: AddressOpt = None,
) -> None:
    """Debug a running job: mark a role unhealthy (a recovery runs), read or set its step."""
    if action not in DEBUG_ACTIONS:
        raise fail(f"unknown action {action!r}; use one of: {', '.join(DEBUG_ACTIONS)}")
    if action == "set-step" and step is None:
        raise fail("set-step needs --step N")
    try:
        result = connect_existing(address).debug(job, DEBUG_ACTIONS[action], role, rank, step)
    except DLUError as exc:
        raise fail(str(exc)) from None
    for actor, value in result.items():
        typer.echo(f"{actor}\t{value}")


@app.command()
def scale(
    job: Annotated[str, typer.Argument(help="Job name.")],
    role: Annotated[
        str, typer.Argument(help="A simple role of the job, or an elastic one with nnodes MIN:MAX.")
    ],
    size: Annotated[
        int, typer.Argument(help="Its new actor count (>= 1); for an elastic role its node count, MIN..MAX.")
    ],
    address: AddressOpt = None,
) -> None:
    """Resize a role of a running job: a simple role's new actors start, surplus ones (highest
    ranks) stop; an elastic role gets N nodes (MIN..MAX) and re-forms training in place."""
    if size < 1:
        raise fail(f"size {size} is not allowed: give a whole number >= 1")
    from dlu_api.spec.model_base import MAX_ACTORS  # here: other commands do not pay for the spec models

    if size > MAX_ACTORS:
        raise fail(f"size {size} is not allowed: a role has at most {MAX_ACTORS} actors, as in a spec")
    try:
        result = connect_existing(address).scale(job, role, size)
    except DLUError as exc:
        raise fail(str(exc)) from None
    if result.get("failed"):
        raise fail(str(result.get("message")), code=1)
    if not result.get("done"):
        typer.echo(f"{role}: resize {result['old_size']} -> {result['new_size']} saved and still running")
        return
    typer.echo(f"{role}: {result.get('message') or 'resized'}")


@app.command(name="list")
def list_jobs(
    address: AddressOpt = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the jobs as JSON, one object each.")] = False,
) -> None:
    """Jobs known locally or on the cluster, newest first: name, stage, exit code, start and end."""
    try:
        jobs = connect_existing(address).list_jobs()
    except DLUError as exc:
        raise fail(str(exc)) from None
    if as_json:
        typer.echo(json.dumps([job.model_dump(mode="json") for job in jobs], indent=2))
        return
    typer.echo(jobs_table(jobs))
