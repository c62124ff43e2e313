"""The one convention every benchmark follows, so `run_all.py` can read any of them.

A benchmark prints whatever it likes, then ends with one line per figure it measures:

    FIGURE {"name": "rendezvous_1000_agents", "value": 0.61, "unit": "s", "budget": 1.0, ...}

`FIGURE ` and a JSON object with `name`, `value`, `unit`, `budget` (null when the figure has no
budget in DESIGN section 9) and `label` (the human sentence the table shows). A figure is within
budget when `value <= budget`: every budget of section 9 is an upper bound.

The module has no dependencies so each benchmark still runs alone (`uv run python
benchmarks/X.py`); scripts import it by name because the script's own folder is on sys.path.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

PREFIX = "FIGURE "


@dataclass(frozen=True)
class Figure:
    """One measured figure; `budget` is an upper bound, or None when there is none."""

    name: str
    value: float
    unit: str
    budget: float | None = None
    label: str = ""

    @property
    def within(self) -> bool | None:
        return None if self.budget is None else self.value <= self.budget

    def line(self) -> str:
        return PREFIX + json.dumps(asdict(self))


def figure(name: str, value: float, unit: str, budget: float | None = None, label: str = "") -> Figure:
    """Print the machine-readable line of one figure (call these last) and return it."""
    found = Figure(name, round(float(value), 6), unit, budget, label or name)
    print(found.line(), flush=True)
    return found


def parse(output: str) -> list[Figure]:
    """Every FIGURE line of a benchmark's output; other lines, and malformed ones, are skipped."""
    found: list[Figure] = []
    for line in output.splitlines():
        if not line.startswith(PREFIX):
            continue
        try:
            data = json.loads(line[len(PREFIX) :])
            found.append(
                Figure(
                    name=str(data["name"]),
                    value=float(data["value"]),
                    unit=str(data["unit"]),
                    budget=None if data.get("budget") is None else float(data["budget"]),
                    label=str(data.get("label") or data["name"]),
                )
            )
        except (ValueError, KeyError, TypeError):
            continue
    return found


def compile_workspace() -> None:
    """Byte-compile DLU's own packages before timing anything.

    They are installed editable, so neither `UV_COMPILE_BYTECODE` nor a first import (this
    machine sets PYTHONDONTWRITEBYTECODE=1) writes their bytecode, and every process would
    compile them again: about 0.2 s of CPU per process that imports them. An installed DLU has
    its bytecode, as its users get.
    """
    import compileall

    root = Path(__file__).resolve().parents[1]
    for src in sorted(root.glob("packages/*/src")):
        compileall.compile_dir(src, quiet=1)
