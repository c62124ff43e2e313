"""The README's command table lists every `dlu` command."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import typer.main

from dlu_api.cli import app

README = Path(__file__).resolve().parents[3] / "README.md"


def test_the_readme_command_table_lists_every_command() -> None:
    group: Any = typer.main.get_command(app)
    rows = [line for line in README.read_text(encoding="utf-8").splitlines() if line.startswith("| `dlu ")]
    listed = {name for row in rows for name in re.findall(r"`dlu ([a-z-]+)", row.split(" | ")[0])}
    assert set(group.commands) <= listed, sorted(set(group.commands) - listed)
