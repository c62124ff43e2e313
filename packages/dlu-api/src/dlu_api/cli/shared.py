"""The `dlu` Typer app and what its command modules share: the common options and the error exit."""

from __future__ import annotations

import sys
from typing import Annotated

import typer

from dlu_api.cli.console import VERBOSE_ENV

app = typer.Typer(
    name="dlu",
    help="DLU: run and watch distributed deep-learning jobs on Ray.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    # Help texts are plain text: rich markup would eat bracketed words such as `[role/rankN]`.
    rich_markup_mode=None,
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


def echo(line: str, err: bool = False) -> None:
    """Print a line through whatever `sys.stdout` (`sys.stderr`) is now. While `dlu run`'s live
    view is drawn, rich has put proxies there that print each line above the view, where it
    stays; `typer.echo` would find the terminal beneath them and be drawn over by the next
    redraw."""
    stream = sys.stderr if err else sys.stdout
    stream.write(line + "\n")
    stream.flush()


def fail(message: str, code: int = 2) -> typer.Exit:
    echo(f"error: {message}", err=True)
    return typer.Exit(code)
