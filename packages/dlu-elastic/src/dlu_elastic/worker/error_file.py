"""torchrun's error files: where a rank's `@record` writes its failure, and reading it back.

`torch.distributed.elastic.multiprocessing.errors.record` writes the exception of a failed
rank as JSON to `TORCHELASTIC_ERROR_FILE`; torchrun reads it back into its failure report. DLU
gives each rank such a file next to its log files (emptied before every start, so a file is
always this start's) and puts what the rank wrote into the failure it reports, and so into the
stop reason and `dlu status`.
"""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path
from typing import Any, cast

from dlu_api.rank_logs import run_dir

ENV = "TORCHELASTIC_ERROR_FILE"
# The most of a file read back: a traceback, not a core dump.
_MAX_BYTES = 256 * 1024


def error_file(root: str | Path, job: str, run_id: str, role: str, rank: int) -> Path:
    """The error file of `rank`, next to its log files."""
    return run_dir(root, job, run_id) / role / f"rank{rank}.error.json"


def prepare(path: Path) -> str:
    """Make the file's directory and remove a previous start's file; the path to export, or ""
    (torch then writes no file, as under torchrun with no log dir) where it cannot be made."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
    except OSError:
        return ""
    return str(path)


def read_error(path: str | None) -> str | None:
    """What a failed rank wrote to its error file: the message, then its traceback; None when
    there is no file (the rank did not use `@record`) or it holds nothing readable."""
    if not path:
        return None
    try:
        with open(path, "rb") as handle:
            raw = handle.read(_MAX_BYTES)
        data: Any = json.loads(raw.decode("utf-8", "replace"))
    except (OSError, ValueError):
        return None
    message: Any = data.get("message") if isinstance(data, dict) else None  # pyright: ignore[reportUnknownMemberType]
    if isinstance(message, str):
        return message.strip() or None
    if not isinstance(message, dict):
        return None
    body = cast(dict[str, Any], message)
    text = str(body.get("message") or "").strip()
    extra: Any = body.get("extraInfo")
    stack = (
        str(cast(dict[str, Any], extra).get("py_callstack") or "").strip() if isinstance(extra, dict) else ""
    )
    if stack and text and not stack.endswith(text):
        return f"{stack}\n{text}"
    return stack or text or None


def failure_text(traceback_text: str) -> str:
    """A failure as the rank reports it: what its error file says, when `@record` (or the
    script itself) wrote one, as torchrun reports it; else the traceback DLU caught."""
    path = os.environ.get(ENV)
    written = read_error(path)
    if written is None:
        return traceback_text
    return f"(from the rank's error file {path})\n{written}"
