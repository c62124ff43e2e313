"""The fenced code blocks of README.md and docs/*.md, with the marker that says how each is tested.

Convention (written in the Markdown, on the line right before the opening fence):

    <!-- snippet: no-run (why) -->     shown, not run: python is compiled, yaml parsed, bash
                                       syntax-checked (e.g. it needs a Kubernetes cluster)
    <!-- snippet: fragment (why) -->   part of something: a yaml fragment is validated inside a
                                       minimal job spec; python is compiled

Without a marker a block runs as printed: python as a script from the repository root, a yaml
job spec is validated and run, bash as a script (`uv run X` runs X in this environment).
Blocks in other languages, or none, are shown text (output, layouts) and never run.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RUNNABLE = frozenset({"python", "yaml", "bash"})
MARKERS = frozenset({"no-run", "fragment"})

_FENCE = re.compile(r"^```([\w-]*)\s*$")
_MARKER = re.compile(r"^<!--\s*snippet:\s*([\w-]+)\s*\((.+)\)\s*-->\s*$")


@dataclass(frozen=True)
class Snippet:
    path: str  # relative to the repository root
    line: int  # of the opening fence, 1-based
    lang: str
    code: str
    marker: str | None = None
    reason: str | None = None

    @property
    def id(self) -> str:
        return f"{self.path}:{self.line}"

    @property
    def runs(self) -> bool:
        return self.lang in RUNNABLE and self.marker is None


class MarkerError(ValueError):
    """A `<!-- snippet: ... -->` comment that does not follow the convention."""


def doc_files(root: Path = ROOT) -> list[Path]:
    return [root / "README.md", *sorted((root / "docs").glob("*.md"))]


def extract(text: str, path: str) -> list[Snippet]:
    """Every fenced block of one Markdown file, with its marker.

    Raises:
        MarkerError: a snippet comment with an unknown marker, no reason, or no block after it.
    """
    lines = text.splitlines()
    out: list[Snippet] = []
    pending: tuple[str, str, int] | None = None
    index = 0
    while index < len(lines):
        line = lines[index]
        if line.strip().startswith("<!-- snippet"):
            found = _MARKER.match(line.strip())
            if found is None or found.group(1) not in MARKERS or not found.group(2).strip():
                raise MarkerError(
                    f"{path}:{index + 1}: write `<!-- snippet: no-run (why) -->` or "
                    f"`<!-- snippet: fragment (why) -->`, got {line.strip()!r}"
                )
            pending = (found.group(1), found.group(2).strip(), index + 1)
            index += 1
            continue
        fence = _FENCE.match(line)
        if fence is None:
            if line.strip() and pending is not None:
                raise MarkerError(
                    f"{path}:{pending[2]}: a snippet marker must come right before a code block"
                )
            index += 1
            continue
        end = index + 1
        while end < len(lines) and not lines[end].startswith("```"):
            end += 1
        marker, reason = (pending[0], pending[1]) if pending is not None else (None, None)
        lang = fence.group(1).lower()
        lang = {"sh": "bash", "shell": "bash", "yml": "yaml", "py": "python"}.get(lang, lang)
        out.append(Snippet(path, index + 1, lang, "\n".join(lines[index + 1 : end]) + "\n", marker, reason))
        pending = None
        index = end + 1
    if pending is not None:
        raise MarkerError(f"{path}:{pending[2]}: a snippet marker must come right before a code block")
    return out


def all_snippets(root: Path = ROOT) -> list[Snippet]:
    out: list[Snippet] = []
    for file in doc_files(root):
        out += extract(file.read_text(encoding="utf-8"), str(file.relative_to(root)))
    return out
