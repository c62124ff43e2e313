"""The `dlu` command line. Exit codes: the job's own for `run` (130 when interrupted); 0 ok;
1 failed check; 2 usage errors and refusals (e.g. a job name already running)."""

from __future__ import annotations

import contextlib
import gc
import logging
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, NoReturn

import typer

from dlu_api.cli import detach, interrupts
from dlu_api.cli.console import job_console, quiet_python_warnings
from dlu_api.cli.gpu import default_device_type
from dlu_api.cli.interrupts import EXIT_INTERRUPTED
from dlu_api.cli.render import ProgressPrinter, status_text
from dlu_api.cli.shared import AddressOpt, VerboseOpt, WorkdirOpt, app
from dlu_api.cli.shared import echo as _echo
from dlu_api.cli.shared import fail as _fail
from dlu_api.cli.tee import RankTee
from dlu_api.client import ADDRESS_ENV, JobClient, connect
from dlu_api.client.local import check_local, local_client
from dlu_api.errors import DLUError
from dlu_api.status import JobStatus

if TYPE_CHECKING:  # imported where a job is run: `dlu status` does not pay for the spec models
    from dlu_api.spec.models import JobSpec


def _spec_from_args(
    args: list[str], name: str | None, device_type: str | None, address: str | None = None
) -> JobSpec:
    from dlu_api.builder import from_torchrun_cmd
    from dlu_api.spec.entrypoint import is_torchrun_command
    from dlu_api.spec.io import read_spec_data, spec_from_dict

    if not args:
        raise ValueError("give a spec file, or `-- torchrun [flags] script.py args...`")
    if is_torchrun_command(args):
        return from_torchrun_cmd(args, name=name, device_type=device_type or default_device_type(address))
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
    """Start a stored job again from its state store (on a new Ray cluster after the old one was
    lost, for one): a job-level restart that keeps the job's counters, budgets and timeline."""
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
    ended, exit_now = False, False

    def on_update(status: JobStatus) -> None:
        tee.see(status)
        console(status)

    try:
        try:
            job = start(spec)
        except (DLUError, ValueError) as exc:
            raise _fail(str(exc)) from None
        except KeyboardInterrupt:
            _echo(f"interrupted: job {spec.name} was not started", err=True)
            raise typer.Exit(EXIT_INTERRUPTED) from None
        metrics_url = getattr(client, "metrics_url", None)  # a local run's Prometheus endpoint
        if metrics_url:
            _echo(f"metrics: {metrics_url}")
        try:
            final, code = _follow(client, job, on_update)
        finally:
            tee.stop()  # what the ranks printed last, before the final status
            console.stop()  # the terminal back, whatever happened
        console.close(final, tracebacks=not tee.traceback_shown)
        ended = True
    finally:
        with interrupts.shielded(f"dlu: shutting down, a moment (`kill -9 {os.getpid()}` ends it now)"):
            if ended:
                exit_now = client.close_at_exit()
            else:
                client.close()
    if exit_now:
        _exit_at_once(code)
    raise typer.Exit(code)


def _exit_at_once(code: int) -> NoReturn:
    """End this process now, with `code`, once what it printed is out: the job has ended and its
    end is recorded, and what the client still held ends with the process (`close_at_exit`).
    The interpreter's own teardown is skipped: its exit hooks (Ray's would shut the embedded Ray
    down process by process) and the last garbage collection."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):  # a closed pipe: nothing more to show
            stream.flush()
    logging.shutdown()
    os._exit(code)


def _follow(client: JobClient, job: str, printer: Callable[[JobStatus], None]) -> tuple[JobStatus, int]:
    """Wait for the job to stop: the first interrupt stops it cleanly, a second one at once."""
    with interrupts.terminate_as_interrupt():
        try:
            final = client.wait(job, printer)
            return final, final.exit_code if final.exit_code is not None else 1
        except KeyboardInterrupt:
            _echo(f"interrupted: stopping job {job} ... (interrupt again to stop it at once)", err=True)
        try:
            client.stop(job)
            return client.wait(job, printer), EXIT_INTERRUPTED
        except KeyboardInterrupt:
            note = f"dlu: already stopping job {job} at once, a moment (`kill -9 {os.getpid()}` ends it now)"
            with interrupts.shielded(note):
                _echo(f"interrupted again: stopping job {job} at once ...", err=True)
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
    typer.echo(f"submitted {job} to {address}; " + detach.follow_hint(job, address))


# The topic modules register their commands on `app` when imported; imported after run, resume
# and submit are, so that `dlu --help` lists the commands in the same order as before.
from dlu_api.cli import brain_commands, job_commands, spec_commands  # noqa: E402

COMMAND_MODULES = (job_commands, spec_commands, brain_commands)  # the commands beyond run, resume and submit


def main() -> None:
    try:
        app()
    finally:
        # The interpreter's last garbage collection at exit walks every object Ray's and
        # pydantic's modules made: 0.2 to 0.4 s after a `dlu run`, for memory freed anyway.
        gc.freeze()
