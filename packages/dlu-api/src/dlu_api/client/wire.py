"""What the cluster-side launcher tells a remote driver, through the Ray job's log.

A driver that has only the Ray Jobs REST API cannot call the PrimeMaster; what it can read is
the log of the job it submitted. So the launcher (`python -m dlu_prime ...`) writes a few
machine lines there, each a tag and one JSON value, among its human-readable progress:

- `DLU-ACCEPTED {...}`: the job passed the cluster's checks and its PrimeMaster exists;
- `DLU-STATUS {...}`: a `JobStatus` (on every stage change, at the end, and from `status`);
- `DLU-ERROR {...}`: why the launcher refused or failed (`kind`, `message`, `problems`).

Both sides import this module (dlu-prime depends on dlu-api), so the format lives once.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from dlu_api.status import JobStatus

ACCEPTED = "DLU-ACCEPTED"
STATUS = "DLU-STATUS"
ERROR = "DLU-ERROR"
DEBUG = "DLU-DEBUG"  # the answer of a `dlu debug` probe: {"result": {...}} or {"error": "..."}
TAGS = (ACCEPTED, STATUS, ERROR, DEBUG)

# DLU-ERROR kinds
KIND_SPEC = "spec"
KIND_NAME_TAKEN = "name_taken"
KIND_VERSION = "version"
KIND_OTHER = "error"

API_VERSION_FLAG = "--api-version"


def line(tag: str, value: Any) -> str:
    """One wire line; JSON on one line whatever the value holds."""
    return f"{tag} {json.dumps(value, separators=(',', ':'))}"


def status_line(status: JobStatus) -> str:
    return f"{STATUS} {status.model_dump_json()}"


def is_wire_line(text: str) -> bool:
    return text.startswith(TAGS)


@dataclass
class LauncherReport:
    """Everything the wire lines of one log say; the latest of each kind wins."""

    accepted: dict[str, Any] | None = None
    status: JobStatus | None = None
    error: dict[str, Any] | None = None
    other_lines: list[str] = field(default_factory=list[str])


def parse_log(text: str | Iterable[str]) -> LauncherReport:
    """Read the wire lines of a launcher's log; a line that does not parse counts as plain text."""
    report = LauncherReport()
    lines = text.splitlines() if isinstance(text, str) else list(text)
    for raw in lines:
        tag, _, payload = raw.partition(" ")
        if tag not in TAGS:
            report.other_lines.append(raw)
            continue
        try:
            value = json.loads(payload)
            if tag == STATUS:
                report.status = JobStatus.model_validate(value)
            elif tag == ACCEPTED:
                report.accepted = dict(value)
            else:
                report.error = dict(value)
        except (ValueError, TypeError):
            report.other_lines.append(raw)
    return report


def major_minor(version: str) -> tuple[int, int] | None:
    """(major, minor) of a version string such as '0.1.0' or '1.2.3rc1'; None if it has none."""
    parts = version.split(".")
    try:
        return int(parts[0]), int("".join(ch for ch in parts[1] if ch.isdigit()) or "x")
    except (IndexError, ValueError):
        return None


def debug_answer(text: str | Iterable[str]) -> dict[str, Any] | None:
    """The last DLU-DEBUG line of a probe's log, parsed."""
    lines = text.splitlines() if isinstance(text, str) else list(text)
    for raw in reversed(lines):
        if raw.startswith(DEBUG + " "):
            found: dict[str, Any] = json.loads(raw[len(DEBUG) + 1 :])
            return found
    return None


def follow_log(
    read: Callable[[], str], finished: Callable[[], bool], follow: bool, poll_s: float
) -> Iterator[str]:
    """The human lines of a launcher's log (`read()` returns all of it so far), wire lines left
    out; with `follow`, new ones until `finished()`, then the rest."""
    seen = 0
    while True:
        text = read()
        complete = text[seen:].rpartition("\n")[0]
        if complete:
            yield from (line for line in complete.split("\n") if not is_wire_line(line))
            seen += len(complete) + 1
        if not follow or finished():
            rest = read()[seen:]
            if rest:
                yield from (line for line in rest.rstrip("\n").split("\n") if not is_wire_line(line))
            return
        time.sleep(poll_s)
