"""What the cluster-side launcher tells a remote driver, through the Ray job's log.

A driver that has only the Ray Jobs REST API cannot call the PrimeMaster; what it can read is
the log of the job it submitted. So the launcher (`python -m dlu_prime ...`) writes a few
machine lines there, each a tag and one JSON value, among its human-readable progress:

- `DLU-ACCEPTED {...}`: the job passed the cluster's checks and its PrimeMaster exists;
- `DLU-STATUS {...}`: a `JobStatus` whenever it changes (the ranks' steps and metrics alone at
  most every few seconds: `dlu_prime.publish`), at the end, and from `status`;
- `DLU-ERROR {...}`: why the launcher refused or failed (`kind`, `message`, `problems`);
- `DLU-EVENT {...}`: each event of the job's timeline, once, as it happens (the whole timeline
  however long, where a `DLU-STATUS` carries none or a bounded tail);
- `DLU-ANSWER {...}`: the answer to a request the driver left in the job's mailbox
  (`{"id": ..., "result": {...}}` or `{"id": ..., "error": "..."}`).

Requests go the other way through a *mailbox*: the driver uploads a small JSON document with the
Jobs API's package upload (`PUT /api/packages/gcs/<mail_package(...)>`), which stores it in the
GCS key-value store under `gcs://<name>`; the launcher polls the keys of its job, deletes each
request it reads and answers it in its log. No Ray job is started for a request.

Both sides import this module (dlu-prime depends on dlu-api), so the format lives once.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from dlu_api.status import JobEvent, JobStatus

ACCEPTED = "DLU-ACCEPTED"
STATUS = "DLU-STATUS"
ERROR = "DLU-ERROR"
DEBUG = "DLU-DEBUG"  # the answer of a `dlu debug` probe: {"result": {...}} or {"error": "..."}
EVENT = "DLU-EVENT"
ANSWER = "DLU-ANSWER"
TAGS = (ACCEPTED, STATUS, ERROR, DEBUG, EVENT, ANSWER)

MAILBOX = "mailbox"  # the key of DLU-ACCEPTED saying the launcher reads requests from its mailbox
MAIL_PROTOCOL = "gcs"
_MAIL_PREFIX = "_dlu_mail."


def mail_package(job: str, key: str) -> str:
    """The package name a request for `job` is uploaded under (one URL path segment)."""
    return f"{_MAIL_PREFIX}{job}.{key}.json"


def mail_prefix(job: str) -> str:
    """The GCS key prefix of every request for `job` (what the launcher lists)."""
    return f"{MAIL_PROTOCOL}://{_MAIL_PREFIX}{job}."


def mail_key(stored_key: str, job: str) -> str:
    """The request id inside a stored key `gcs://_dlu_mail.<job>.<id>.json`."""
    return stored_key.removeprefix(mail_prefix(job)).removesuffix(".json")


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


def event_line(event: JobEvent) -> str:
    return f"{EVENT} {event.model_dump_json(exclude_defaults=True)}"


def is_wire_line(text: str) -> bool:
    return text.startswith(TAGS)


@dataclass
class LauncherReport:
    """Everything the wire lines of one log say; the latest of each kind wins."""

    accepted: dict[str, Any] | None = None
    status: JobStatus | None = None
    error: dict[str, Any] | None = None
    events: list[JobEvent] = field(default_factory=list[JobEvent])
    answers: dict[str, dict[str, Any]] = field(default_factory=dict[str, dict[str, Any]])
    other_lines: list[str] = field(default_factory=list[str])

    @property
    def current(self) -> JobStatus | None:
        """The latest status with the whole timeline the DLU-EVENT lines gave (a launcher that
        writes none: the status's own events)."""
        if self.status is None or not self.events:
            return self.status
        return self.status.model_copy(update={"events": list(self.events)})


class LogParser:
    """The wire lines of a launcher's log, fed as they come; `report()` says what they said so far.

    Only the latest DLU-STATUS is ever parsed, when a report asks for it: a week-long job's log
    holds some 120,000 of them (one per status interval), and parsing each one made one read
    of a day-old 4-rank job's log cost 0.14 s of CPU, against 0.014 s
    (`benchmarks/remote_log_poll.py`).
    """

    def __init__(self) -> None:
        self._report = LauncherReport()
        self._status_line: str | None = None  # the latest DLU-STATUS line, not parsed yet

    def feed(self, lines: Iterable[str]) -> None:
        report = self._report
        for raw in lines:
            tag, _, payload = raw.partition(" ")
            if tag not in TAGS:
                report.other_lines.append(raw)
                continue
            if tag == STATUS:
                self._status_line = raw
                continue
            try:
                value = json.loads(payload)
                if tag == EVENT:
                    report.events.append(JobEvent.model_validate(value))
                elif tag == ACCEPTED:
                    report.accepted = dict(value)
                elif tag == ANSWER:
                    report.answers[str(value["id"])] = dict(value)
                else:
                    report.error = dict(value)
            except (ValueError, TypeError, KeyError):
                report.other_lines.append(raw)

    def report(self) -> LauncherReport:
        """What the lines fed so far say (a copy: later lines do not change it); a latest status
        line that does not parse counts as plain text, and the one before it stands."""
        report = self._report
        if self._status_line is not None:
            raw, self._status_line = self._status_line, None
            try:
                report.status = JobStatus.model_validate_json(raw.partition(" ")[2])
            except ValueError:
                report.other_lines.append(raw)
        return LauncherReport(
            accepted=report.accepted,
            status=report.status,
            error=report.error,
            events=list(report.events),
            answers=dict(report.answers),
            other_lines=list(report.other_lines),
        )


def parse_log(text: str | Iterable[str]) -> LauncherReport:
    """Read the wire lines of a launcher's log; a line that does not parse counts as plain text."""
    parser = LogParser()
    parser.feed(text.splitlines() if isinstance(text, str) else text)
    return parser.report()


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
