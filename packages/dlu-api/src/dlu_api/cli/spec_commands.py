"""`dlu` commands on spec files, no cluster needed: validate and schema.

Registered on the one `dlu` app (`dlu_api.cli.shared.app`) when `dlu_api.cli` imports this module.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Annotated

import typer

from dlu_api.cli.shared import app
from dlu_api.errors import SpecError


def check_file(path: Path) -> None:
    """What `dlu validate` checks in one spec file: the spec, and its roles' data channels as
    read from the current directory (where `dlu run` looks for the job's code too).

    Raises:
        SpecError: every problem found.
    """
    from dlu_api.spec.channels import channel_problems  # here: other commands do not pay for them
    from dlu_api.spec.io import load_spec

    spec = load_spec(path)
    problems = channel_problems(spec, os.getcwd())
    if problems:
        raise SpecError(problems)


@app.command()
def validate(specs: Annotated[list[Path], typer.Argument(help="Spec files to check.")]) -> None:
    """Check spec files and print every problem, each with its field and fix (a data channel that
    a role reads and no role writes included)."""
    bad = 0
    for path in specs:
        try:
            check_file(path)
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
    from dlu_api.spec.io import job_schema

    text = json.dumps(job_schema(), indent=2) + "\n"
    if output is None:
        sys.stdout.write(text)
    else:
        output.write_text(text, encoding="utf-8")
