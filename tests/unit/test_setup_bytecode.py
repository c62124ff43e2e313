"""The workspace is byte-compiled once, by the README's setup step, not at every `uv run`: uv's
`compile-bytecode` setting recompiles the whole venv on each command (astral-sh/uv#12202)."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SETUP = "UV_COMPILE_BYTECODE=1 uv sync --all-packages --locked"


def test_no_command_compiles_the_venv_again() -> None:
    uv = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["uv"]
    assert "compile-bytecode" not in uv


def test_the_readme_sets_up_byte_compiled_before_its_first_uv_run() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    blocks = re.findall(r"```bash\n(.*?)```", readme, flags=re.S)
    commands = [
        line for block in blocks for line in block.splitlines() if line.startswith("uv ") or SETUP in line
    ]
    assert commands and commands[0] == SETUP, commands[:3]


def test_ci_runs_the_same_setup() -> None:
    assert SETUP in (ROOT / ".ci" / "run").read_text(encoding="utf-8")
