"""The `dlu` command line. Exit codes: the job's own for `run` (130 when interrupted); 0 ok;
1 failed check; 2 usage errors and refusals (e.g. a job name already running)."""

from __future__ import annotations

import gc
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, NoReturn

import typer

from dlu_api.builder import from_torchrun_cmd
from dlu_api.cli import detach, interrupts
from dlu_api.cli.console import VERBOSE_ENV, job_console, quiet_python_warnings
from dlu_api.cli.gpu import default_device_type
from dlu_api.cli.interrupts import EXIT_INTERRUPTED
from dlu_api.cli.render import ProgressPrinter, status_text
from dlu_api.cli.tee import RankTee
from dlu_api.client import ADDRESS_ENV, JobClient, connect
from dlu_api.client.local import check_local, local_client
from dlu_api.errors import DLUError, SpecError
from dlu_api.spec.entrypoint import is_torchrun_command
from dlu_api.spec.io import job_schema, load_spec, read_spec_data, spec_from_dict
from dlu_api.spec.models import JobSpec
from dlu_api.status import JobStatus

app = typer.Typer(
    name="dlu",
    help="DLU: run and watch distributed deep-learning jobs on Ray.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

AddressOpt = Annotated[
    str | None,
    typer.Option("--address", "-a", envvar="DLU_ADDRESS", help="Ray job server URL; unset: local."),
]
VerboseOpt = Annotated[
    bool,
    typer.Option(
        "--verbose",
        "-v",
        envvar=VERBOSE_ENV,
        help="Also show Ray's own warnings and logs, DLU's actors' logs and what the job's "
        "processes print (a local run); without it, only the job's progress.",
    ),
]
WorkdirOpt = Annotated[
    str | None,
    typer.Option(
        "--workdir",
        envvar="DLU_WORKDIR",
        help="With --address: the job's code. A directory on this machine is uploaded (as `ray job "
        "submit --working-dir`; .git, __pycache__, .venv left out; limit $DLU_UPLOAD_LIMIT_MB, default "
        "100); cluster:/path names a directory on the cluster's nodes; a URI (s3://...) is fetched by Ray.",
    ),
]


def _echo(line: str) -> None:
    typer.echo(line)


def _fail(message: str, code: int = 2) -> typer.Exit:
    typer.echo(f"error: {message}", err=True)
    return typer.Exit(code)


def _spec_from_args(
    args: list[str], name: str | None, device_type: str | None, address: str | None = None
) -> JobSpec:
    if not args:
        raise ValueError("give a spec file, or `-- torchrun [flags] script.py args...`")
    if is_torchrun_command(args):
        return from_torchrun_cmd(
            args, name=name or "torchrun-job", device_type=device_type or default_device_type(address)
        )
    if len(args) != 1:
        raise ValueError(f"expected one spec file or a torchrun command after '--', got {' '.join(args)!r}")
    updates: dict[str, object] = {}
    if name:
        updates["name"] = name
    if device_type:
        updates["device_type"] = device_type.upper()
    data = read_spec_data(args[0])
    # Override the file as written, not a loaded spec: values derived from the old ones (an
    # elastic rank's GPU count follows device_type) must be derived afresh, then checked.
    return spec_from_dict({**data, **updates} if isinstance(data, dict) and updates else data)


@app.command()
def run(
    spec_or_command: Annotated[
        list[str], typer.Argument(help="A spec file, or '-- torchrun [flags] script.py args...'.")
    ],
    name: Annotated[str | None, typer.Option(help="Job name (overrides the spec's).")] = None,
    device_type: Annotated[
        str | None,
        typer.Option(
            "--device-type",
            help="GPU or CPU (a torchrun command defaults to GPU where one is visible, or on a cluster; else CPU).",
        ),
    ] = None,
    address: AddressOpt = None,
    workdir: WorkdirOpt = None,
    no_wait: Annotated[
        bool,
        typer.Option(
            "--no-wait",
            help="Return once the job is RUNNING and leave it running (a local job's controller "
            "goes on in a detached process); prints how to follow and stop it.",
        ),
    ] = False,
    verbose: VerboseOpt = False,
) -> None:
    """Run a job and wait for it, showing its stage, roles, restarts and each failure and recovery
    (a live view in a terminal, one line per event otherwise). Exits with the job's code;
    `--no-wait` prints plain lines until the job is RUNNING and returns, leaving it running.

    Ctrl-C (or SIGTERM) stops the job cleanly and exits with 130; a second one stops it at once.
    A local run of a job name that another process on this machine runs is refused."""
    if not verbose:
        quiet_python_warnings()
    try:
        spec = _spec_from_args(spec_or_command, name, device_type, address)
        if no_wait and _is_local(address):
            _run_detached_local(spec, verbose)
        client = connect(address, workdir, spec, quiet=not verbose)
    except (DLUError, ValueError) as exc:
        raise _fail(str(exc)) from None
    if no_wait:
        _start_and_return(client, spec, address or os.environ.get(ADDRESS_ENV) or "")
    _start_and_follow(client, spec, client.submit)


def _is_local(address: str | None) -> bool:
    address = address or os.environ.get(ADDRESS_ENV) or None
    return address is None or address == "local"


def _run_detached_local(spec: JobSpec, verbose: bool) -> NoReturn:
    """`dlu run --no-wait` on this machine: a detached `dlu run` runs the job (plain lines into
    its console log, `--verbose` passed on); exits once it is RUNNING (0), or with that
    process's code if it ended first."""
    check_local(spec)  # bad input refused here, before any process starts
    client = local_client()
    files = getattr(client, "files", None)
    if files is None:
        raise DLUError("the installed dlu-prime keeps no job records; upgrade it to match dlu-api")
    process, console = detach.start_local(spec, Path(files.root).parent, verbose)
    printer = ProgressPrinter(_echo)
    try:
        current = detach.wait_local(files.status, spec.name, process, printer)
    except KeyboardInterrupt:
        typer.echo(
            f"interrupted: job {spec.name} goes on in process {process.pid}; `dlu stop {spec.name}` stops it",
            err=True,
        )
        raise typer.Exit(EXIT_INTERRUPTED) from None
    if current is None:
        code = process.wait()
        typer.echo(detach.console_tail(console), err=True)
        raise typer.Exit(code or 1)
    if current.finished:
        typer.echo(status_text(current, events=0))
        raise typer.Exit(current.exit_code if current.exit_code is not None else 1)
    typer.echo(
        f"job {spec.name} is RUNNING in process {process.pid} (its output: {console}); "
        + detach.follow_hint(spec.name, None)
    )
    raise typer.Exit(0)


def _start_and_return(client: JobClient, spec: JobSpec, address: str) -> NoReturn:
    """`dlu run --no-wait` on a cluster: submit, follow until RUNNING, leave it running."""
    printer = ProgressPrinter(_echo)
    try:
        try:
            job = client.submit(spec)
            current = detach.until_running(client, job, printer)
        except DLUError as exc:
            raise _fail(str(exc)) from None
        except KeyboardInterrupt:
            typer.echo(
                f"interrupted: job {spec.name} goes on; `dlu stop {spec.name} --address {address}` stops it",
                err=True,
            )
            raise typer.Exit(EXIT_INTERRUPTED) from None
    finally:
        client.close()
    if current.finished:
        typer.echo(status_text(current, events=0))
        raise typer.Exit(current.exit_code if current.exit_code is not None else 1)
    typer.echo(f"job {job} is RUNNING on {address}; " + detach.follow_hint(job, address))
    raise typer.Exit(0)


@app.command()
def resume(
    spec_file: Annotated[Path, typer.Argument(help="The job's spec (it names the state store).")],
    address: AddressOpt = None,
    workdir: WorkdirOpt = None,
    verbose: VerboseOpt = False,
) -> None:
    """Start a stored job again from its state store, e.g. on a new Ray cluster after the old one
    was lost: a job-level restart that keeps the job's counters, budgets and timeline."""
    if not verbose:
        quiet_python_warnings()
    try:
        spec = _spec_from_args([str(spec_file)], None, None)
        client = connect(address, workdir, spec, quiet=not verbose)
    except (DLUError, ValueError) as exc:
        raise _fail(str(exc)) from None
    _start_and_follow(client, spec, client.resume)


SECOND_INTERRUPT_REASON = (
    "interrupted twice: stopped at once, its actors killed without waiting for a clean stop"
)


def _start_and_follow(client: JobClient, spec: JobSpec, start: Callable[[JobSpec], str]) -> NoReturn:
    """Start the job, follow it to its end, close the client; exits with the job's code (130
    when interrupted)."""
    console = job_console(_echo)
    tee = RankTee(client, spec, _echo)

    def on_update(status: JobStatus) -> None:
        tee.see(status)
        console(status)

    try:
        try:
            job = start(spec)
        except (DLUError, ValueError) as exc:
            raise _fail(str(exc)) from None
        except KeyboardInterrupt:
            typer.echo(f"interrupted: job {spec.name} was not started", err=True)
            raise typer.Exit(EXIT_INTERRUPTED) from None
        try:
            final, code = _follow(client, job, on_update)
        finally:
            tee.stop()  # what the ranks printed last, before the final status
            console.stop()  # the terminal back, whatever happened
        console.close(final)
    finally:
        with interrupts.shielded(f"dlu: shutting down, a moment (`kill -9 {os.getpid()}` ends it now)"):
            client.close()
    raise typer.Exit(code)


def _follow(client: JobClient, job: str, printer: Callable[[JobStatus], None]) -> tuple[JobStatus, int]:
    """Wait for the job to stop: the first interrupt stops it cleanly, a second one at once."""
    with interrupts.terminate_as_interrupt():
        try:
            final = client.wait(job, printer)
            return final, final.exit_code if final.exit_code is not None else 1
        except KeyboardInterrupt:
            typer.echo(f"interrupted: stopping job {job} ... (interrupt again to stop it at once)", err=True)
        try:
            client.stop(job)
            return client.wait(job, printer), EXIT_INTERRUPTED
        except KeyboardInterrupt:
            note = f"dlu: already stopping job {job} at once, a moment (`kill -9 {os.getpid()}` ends it now)"
            with interrupts.shielded(note):
                typer.echo(f"interrupted again: stopping job {job} at once ...", err=True)
                return client.stop_now(job, SECOND_INTERRUPT_REASON), EXIT_INTERRUPTED


@app.command()
def submit(
    spec_file: Annotated[Path, typer.Argument(help="Job spec (YAML or JSON).")],
    address: AddressOpt = None,
    name: Annotated[str | None, typer.Option(help="Job name (overrides the spec's).")] = None,
    workdir: WorkdirOpt = None,
) -> None:
    """Submit a job to a cluster; returns once the cluster has accepted it (or says why not)."""
    if not address:
        raise _fail("dlu submit needs --address http://HEAD:8265 (or $DLU_ADDRESS); use `dlu run` locally")
    try:
        spec = _spec_from_args([str(spec_file)], name, None)
        job = connect(address, workdir).submit(spec)
    except (DLUError, ValueError) as exc:
        raise _fail(str(exc)) from None
    typer.echo(
        f"submitted {job} to {address}; follow it with `dlu events -f {job}` (its timeline) "
        f"or `dlu logs -f {job}` (what its ranks print)"
    )


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
        raise _fail(str(exc)) from None
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
        raise _fail(str(exc)) from None
    for event in timeline:
        typer.echo(event.model_dump_json())


@app.command()
def stop(job: Annotated[str, typer.Argument(help="Job name.")], address: AddressOpt = None) -> None:
    """Stop a job; its actors and placement groups are removed."""
    try:
        connect(address).stop(job)
    except DLUError as exc:
        raise _fail(str(exc)) from None
    typer.echo(f"stop requested for {job}")


@app.command()
def delete(job: Annotated[str, typer.Argument(help="Job name.")], address: AddressOpt = None) -> None:
    """Remove a stopped or LOST job's record (a running one is refused: stop it first)."""
    try:
        connect(address).delete(job)
    except DLUError as exc:
        raise _fail(str(exc)) from None
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
        raise _fail(str(exc)) from None


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
        raise _fail(f"unknown action {action!r}; use one of: {', '.join(DEBUG_ACTIONS)}")
    if action == "set-step" and step is None:
        raise _fail("set-step needs --step N")
    try:
        result = connect(address).debug(job, DEBUG_ACTIONS[action], role, rank, step)
    except DLUError as exc:
        raise _fail(str(exc)) from None
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
        raise _fail(f"size {size} is not allowed: give a whole number >= 1")
    try:
        result = connect(address).scale(job, role, size)
    except DLUError as exc:
        raise _fail(str(exc)) from None
    if result.get("failed"):
        raise _fail(str(result.get("message")), code=1)
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
        raise _fail(str(exc)) from None
    for job in jobs:
        code = "" if job.exit_code is None else f" exit={job.exit_code}"
        typer.echo(f"{job.name}\t{job.stage.value}{code}\t{job.where}")


@app.command()
def validate(specs: Annotated[list[Path], typer.Argument(help="Spec files to check.")]) -> None:
    """Check spec files and print every problem, each with its field and fix."""
    bad = 0
    for path in specs:
        try:
            load_spec(path)
        except SpecError as exc:
            bad += 1
            typer.echo(f"{path}: {len(exc.problems)} problem(s)")
            for problem in exc.problems:
                typer.echo(f"  - {problem}")
            continue
        typer.echo(f"{path}: ok")
    if bad:
        raise typer.Exit(1)


@app.command()
def schema(
    output: Annotated[Path | None, typer.Option("--output", "-o", help="Write to a file.")] = None,
) -> None:
    """Print the JSON Schema of a job spec."""
    text = json.dumps(job_schema(), indent=2) + "\n"
    if output is None:
        sys.stdout.write(text)
    else:
        output.write_text(text, encoding="utf-8")


def main() -> None:
    try:
        app()
    finally:
        # The interpreter's last garbage collection at exit walks every object Ray's and
        # pydantic's modules made: 0.2 to 0.4 s after a `dlu run`, for memory freed anyway.
        gc.freeze()
