"""`dlu` commands on a job that exists: status, events, stop, delete, logs, debug, scale, list.

Registered on the one `dlu` app (`dlu_api.cli.shared.app`) when `dlu_api.cli` imports this module.
"""

from __future__ import annotations

from typing import Annotated

import typer

from dlu_api.cli.render import status_text
from dlu_api.cli.shared import AddressOpt, app, fail
from dlu_api.client import connect
from dlu_api.errors import DLUError
from dlu_api.spec.model_base import MAX_ACTORS


@app.command()
def status(
    job: Annotated[str, typer.Argument(help="Job name.")],
    address: AddressOpt = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the status as JSON.")] = False,
    events: Annotated[int, typer.Option(help="How many recent events to show.")] = 10,
) -> None:
    """Stage, roles, restart counts and recent events of a job."""
    try:
        current = connect(address).status(job)
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
            for line in connect(address).timeline(job, follow=True):
                typer.echo(line)
            return
        timeline = connect(address).events(job)
    except DLUError as exc:
        raise fail(str(exc)) from None
    for event in timeline:
        typer.echo(event.model_dump_json())


@app.command()
def stop(job: Annotated[str, typer.Argument(help="Job name.")], address: AddressOpt = None) -> None:
    """Stop a job; its actors and placement groups are removed."""
    try:
        connect(address).stop(job)
    except DLUError as exc:
        raise fail(str(exc)) from None
    typer.echo(f"stop requested for {job}")


@app.command()
def delete(job: Annotated[str, typer.Argument(help="Job name.")], address: AddressOpt = None) -> None:
    """Remove a stopped or LOST job's record (a running one is refused: stop it first)."""
    try:
        connect(address).delete(job)
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
        for line in connect(address).logs(job, follow, role=role, rank=rank):
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
        result = connect(address).debug(job, DEBUG_ACTIONS[action], role, rank, step)
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
    if size > MAX_ACTORS:
        raise fail(f"size {size} is not allowed: a role has at most {MAX_ACTORS} actors, as in a spec")
    try:
        result = connect(address).scale(job, role, size)
    except DLUError as exc:
        raise fail(str(exc)) from None
    if result.get("failed"):
        raise fail(str(result.get("message")), code=1)
    if not result.get("done"):
        typer.echo(f"{role}: resize {result['old_size']} -> {result['new_size']} saved and still running")
        return
    typer.echo(f"{role}: {result.get('message') or 'resized'}")


@app.command(name="list")
def list_jobs(address: AddressOpt = None) -> None:
    """Jobs known locally or on the cluster."""
    try:
        jobs = connect(address).list_jobs()
    except DLUError as exc:
        raise fail(str(exc)) from None
    for job in jobs:
        code = "" if job.exit_code is None else f" exit={job.exit_code}"
        typer.echo(f"{job.name}\t{job.stage.value}{code}\t{job.where}")
