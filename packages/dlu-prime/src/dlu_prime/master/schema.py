"""Schema versions of the stored job state, and the migrations between them.

A job's state outlives the dlu-prime that wrote it (a Redis store, `dlu resume` after an
upgrade), so `JobState.loads` upgrades an older document step by step instead of refusing it.
Each step is a pure function of the JSON document, registered in `MIGRATIONS` under the version
it reads; it never touches the input and fills every field it introduces explicitly, so the
next step can rely on the shape it was written for.

History:
  1: the first wave. Documents that say 1 come in two shapes: the first wave's, with a
     `failover_in_progress` flag on the job and on each role and no failover ladder, and the
     later one (failover record, per-role restart counters, SubMaster endpoints, event tiers),
     written before anyone bumped the version.
  2: the failover ladder's document: `failover_in_progress` is gone (a saved `failover` record
     says what is in flight), every counter and field of the later shape is present, and
     STOPPED actors / LOST jobs may appear, which a reader of version 1 cannot parse.
  3: resizable roles (`dlu scale`): an in-flight `resize` record on the job and a
     `resize_count` per role.
  4: event positions: each event has a `seq` (1, 2, ...), the document keeps the last one in
     `event_seq` and the job's first failure in `first_failure` (the root cause outlives the
     bounded timeline).
  5: idempotent requests and resumable resizes: the job's `requests` (request id -> what it
     came to), a resize's `request_id` and `checked` (ranks whose node check passed), a role's
     `target_nodes` and `last_resize_at`. Version-4 documents written late may carry them
     already (they were added inside 4); the step fills what is missing. Added inside 5 before
     its release, each with its default (so a document without them reads as before): a
     request outcome's `verdict` and `counted` (an in-place report judged by its id) and
     `pending` (a mark-unhealthy no pass has judged yet).
  6: memory relaunches: an actor's `memory` override and `memory_raised_at`, and the job's
     `relaunch` record in flight and `relaunch_count`.
  7: reused bundles: an actor's `seat` (the bundle of its role's group it was seated in, one a
     relaunched actor left), and a relaunch record's `seat` and `old_seat`.
  8: a failover record's `alive`: its actors alive as it began, whose deaths before it replaces
     them are faults of their own (seed 17404).
  9: a failover record's `rebuilt`: its actors it began for because Ray rebuilt them on a live
     node, whose loss with that node before it replaces them is a fault of its own (seed 57311).
"""

from __future__ import annotations

import copy
import json
import logging
from collections.abc import Callable
from typing import Any, cast

logger = logging.getLogger(__name__)

SCHEMA_VERSION = 9
"""The version this dlu-prime writes."""

Document = dict[str, Any]
Migration = Callable[[Document], Document]


class SchemaVersionError(ValueError):
    """A stored document this dlu-prime cannot read; the message says which version and the fix."""


def _fill(target: Document, defaults: Document) -> None:
    for key, value in defaults.items():
        target.setdefault(key, copy.deepcopy(value))


def _records(document: Document, field: str) -> list[Document]:
    found: Any = document.get(field)
    if not isinstance(found, dict):
        return []
    values: list[Any] = list(found.values())  # pyright: ignore[reportUnknownArgumentType]
    return [v for v in values if isinstance(v, dict)]


def migrate_1_to_2(document: Document) -> Document:
    """Drop the first wave's `failover_in_progress` flags and fill what either v1 shape lacks.

    The first wave never finished a failover (it had none), so a flag left set cannot be
    completed: it is dropped with a note on the timeline, and the monitor sees the actors' state
    afresh and starts a recovery of its own if one is needed.
    """
    out = copy.deepcopy(document)
    in_flight = bool(out.pop("failover_in_progress", False))
    for role in _records(out, "roles"):
        in_flight = bool(role.pop("failover_in_progress", False)) or in_flight
        _fill(role, {"inplace_restart_count": 0, "sub_master_restart_count": 0, "escalation_count": 0})
    for actor in _records(out, "actors"):
        _fill(actor, {"errors_seen": 0})
    _fill(out, {"failover": None, "endpoints": {}, "channels": {}, "events": []})
    failover: Any = out["failover"]
    if isinstance(failover, dict):
        _fill(failover, {"culprit": None})  # pyright: ignore[reportUnknownArgumentType]
    events: Any = out["events"]
    if isinstance(events, list):
        for event in events:  # pyright: ignore[reportUnknownVariableType]
            if isinstance(event, dict):
                _fill(event, {"tier": None, "duration_s": None})  # pyright: ignore[reportUnknownArgumentType]
        if in_flight:
            events.append(  # pyright: ignore[reportUnknownMemberType]
                {
                    "time": out.get("updated_at", 0.0),
                    "kind": "schema_migrated",
                    "message": "a failover flagged in flight by schema version 1 had no record to "
                    "finish it from; it was dropped and the monitor judges the actors afresh",
                    "role": None,
                    "actor": None,
                    "node_id": None,
                    "tier": None,
                    "duration_s": None,
                }
            )
    out["schema_version"] = 2
    return out


def migrate_2_to_3(document: Document) -> Document:
    """No resize was ever in flight before version 3: `resize` is None, every count 0."""
    out = copy.deepcopy(document)
    for role in _records(out, "roles"):
        _fill(role, {"resize_count": 0})
    _fill(out, {"resize": None})
    out["schema_version"] = 3
    return out


# Kinds of a failure event (dlu_api.diagnosis.FAILURE_KINDS when version 4 was written):
# frozen here so the migration means the same whatever later releases count as a failure.
_V4_FAILURE_KINDS = frozenset(
    {"died", "restarted", "unavailable", "failed", "error_report", "heartbeat_timeout", "hang", "faulty_node"}
)


def migrate_3_to_4(document: Document) -> Document:
    """Number the stored events in order and keep the first failure among them.

    Events the bounded timeline already dropped are gone, so the numbering starts at the oldest
    kept one: positions only need to grow, not to count from the job's start.
    """
    out = copy.deepcopy(document)
    found: Any = out.get("events")
    events: list[Document] = [e for e in found if isinstance(e, dict)] if isinstance(found, list) else []  # pyright: ignore[reportUnknownVariableType]
    for seq, event in enumerate(events, start=1):
        event["seq"] = seq
    out["events"] = events
    out["event_seq"] = len(events)
    out["first_failure"] = next(
        (copy.deepcopy(e) for e in events if e.get("kind") in _V4_FAILURE_KINDS), None
    )
    out["schema_version"] = 4
    return out


def migrate_4_to_5(document: Document) -> Document:
    """Write out the fields of idempotent requests and resumable resizes (a version-4 document
    without them reads the same: nothing asked, nothing checked, no target of its own)."""
    out = copy.deepcopy(document)
    for role in _records(out, "roles"):
        _fill(role, {"target_nodes": None, "last_resize_at": None})
    _fill(out, {"requests": {}})
    resize: Any = out.get("resize")
    if isinstance(resize, dict):
        _fill(resize, {"request_id": None, "checked": []})  # pyright: ignore[reportUnknownArgumentType]
    out["schema_version"] = 5
    return out


def migrate_5_to_6(document: Document) -> Document:
    """No actor was relaunched with more memory before version 6: no override, none in flight."""
    out = copy.deepcopy(document)
    for actor in _records(out, "actors"):
        _fill(actor, {"memory": None, "memory_raised_at": None})
    _fill(out, {"relaunch": None, "relaunch_count": 0})
    out["schema_version"] = 6
    return out


def migrate_6_to_7(document: Document) -> Document:
    """No bundle was reused before version 7: every actor sits where it was planned or in a
    group of its own."""
    out = copy.deepcopy(document)
    for actor in _records(out, "actors"):
        _fill(actor, {"seat": None})
    relaunch: Any = out.get("relaunch")
    if isinstance(relaunch, dict):
        _fill(relaunch, {"seat": None, "old_seat": None})  # pyright: ignore[reportUnknownArgumentType]
    out["schema_version"] = 7
    return out


def migrate_7_to_8(document: Document) -> Document:
    """A failover saved before version 8 says nothing of which actors were alive as it began:
    none is assumed (their deaths are its own work, as that code judged them)."""
    out = copy.deepcopy(document)
    failover: Any = out.get("failover")
    if isinstance(failover, dict):
        _fill(failover, {"alive": []})  # pyright: ignore[reportUnknownArgumentType]
    out["schema_version"] = 8
    return out


def migrate_8_to_9(document: Document) -> Document:
    """A failover saved before version 9 says nothing of which actors Ray had rebuilt as it
    began: none is assumed (their loss with a node stays its own work, as that code judged it)."""
    out = copy.deepcopy(document)
    failover: Any = out.get("failover")
    if isinstance(failover, dict):
        _fill(failover, {"rebuilt": []})  # pyright: ignore[reportUnknownArgumentType]
    out["schema_version"] = 9
    return out


MIGRATIONS: dict[int, Migration] = {
    1: migrate_1_to_2,
    2: migrate_2_to_3,
    3: migrate_3_to_4,
    4: migrate_4_to_5,
    5: migrate_5_to_6,
    6: migrate_6_to_7,
    7: migrate_7_to_8,
    8: migrate_8_to_9,
}
"""`MIGRATIONS[n]` turns a version-n document into a version n+1 one."""


def upgrade(document: Document) -> Document:
    """Bring a stored document to `SCHEMA_VERSION`, one registered step at a time.

    Raises:
        SchemaVersionError: the version is missing or not a known one (a newer dlu-prime wrote
            it, or it is not a job state document).
    """
    version: Any = document.get("schema_version")
    if isinstance(version, bool) or not isinstance(version, int) or version < min(MIGRATIONS, default=1):
        raise SchemaVersionError(
            f"stored job state has schema version {version!r}; this dlu-prime reads versions "
            f"{_readable()}: the field 'schema_version' is missing or wrong, so this is not a job state "
            "document DLU wrote. Delete the job's state (or submit the job again) to start it afresh."
        )
    if version > SCHEMA_VERSION:
        raise SchemaVersionError(
            f"stored job state has schema version {version}, newer than this dlu-prime's "
            f"{SCHEMA_VERSION} (it reads versions {_readable()}): a newer dlu-prime wrote it. "
            f"Upgrade dlu-prime to a release that reads schema {version} (the one that ran the job)."
        )
    start = version
    while version < SCHEMA_VERSION:
        document = MIGRATIONS[version](document)
        version += 1
        if document.get("schema_version") != version:
            raise AssertionError(
                f"migration from schema {version - 1} did not write schema_version {version}"
            )
    if start != SCHEMA_VERSION:
        logger.info("job state upgraded from schema version %d to %d", start, SCHEMA_VERSION)
    return document


def refuse_newer(job: str, data: bytes) -> None:
    """Refuse to replace a stored document a newer dlu-prime wrote (e.g. `dlu run` of the same name
    by an older release): its state would be lost without a word, and the next upgrade's too.

    A document that is not JSON, or names no version, is left to whoever replaces it.

    Raises:
        SchemaVersionError: the stored document's schema version is newer than `SCHEMA_VERSION`.
    """
    try:
        found: Any = json.loads(data)
    except ValueError:
        return
    version: Any = cast(Document, found).get("schema_version") if isinstance(found, dict) else None
    if isinstance(version, int) and not isinstance(version, bool) and version > SCHEMA_VERSION:
        raise SchemaVersionError(
            f"job {job}: the stored state has schema version {version}, newer than this dlu-prime's "
            f"{SCHEMA_VERSION}: a newer dlu-prime ran this job, and this one will not replace its "
            "state. Run the job with that release, choose another job name, or delete the stored "
            "state first if it is no longer wanted."
        )


def _readable() -> str:
    return f"{min(MIGRATIONS, default=SCHEMA_VERSION)} to {SCHEMA_VERSION}"
