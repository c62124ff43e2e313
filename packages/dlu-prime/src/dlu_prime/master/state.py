"""The PrimeManager's state: one versioned, typed document per job.

Everything recovery needs is here, so a reconstructed PrimeMaster can carry on from the store.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Mapping
from typing import Any, Self

from pydantic import BaseModel, ConfigDict, Field

from dlu_api.spec.models import JobSpec
from dlu_api.status import ActorStatus, JobEvent, JobStage, JobStatus, RoleStatus
from dlu_api.vocabulary import FAILURE_EVENTS, ActorStage, EventKind, Tier
from dlu_prime.master.schema import SCHEMA_VERSION as SCHEMA_VERSION  # re-exported for readers
from dlu_prime.master.schema import SchemaVersionError as SchemaVersionError
from dlu_prime.master.schema import upgrade

SUB_MASTER_RANK = -1  # the rank recorded for a role's SubMaster
MAX_EVENTS = 500


def close_actors(state: JobState) -> None:
    """The job ended: an actor that had not finished or failed was stopped, so no final status
    lists one as RUNNING (or READY) after the job is STOPPED."""
    for record in state.actors.values():
        if not record.stage.is_terminal:
            record.stage = ActorStage.STOPPED


def role_size(state: JobState, role: str) -> int:
    """The role's actor count now: its workers in the state (a SubMaster is not counted)."""
    return sum(1 for a in state.actors.values() if a.role == role and a.rank != SUB_MASTER_RANK)


def role_finished(state: JobState, role: str) -> bool:
    """Every worker of `role` finished (its SubMaster aside): training is over for the role, and
    a SubMaster set up again must not start it anew."""
    stages = [a.stage for a in state.actors.values() if a.role == role and a.rank != SUB_MASTER_RANK]
    return bool(stages) and all(stage is ActorStage.FINISH for stage in stages)


ENCODED = "_encoded"
"""Where an `ActorRecord` keeps its JSON for the state writer (`document.py`): the name it was
written under and the bytes. A key of its `__dict__`, no field (never serialised nor compared:
pydantic ignores what else its `__dict__` holds), dropped by every assignment and by a copy
with changes, so what is kept is always the record's."""


class ActorRecord(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str
    role: str
    rank: int
    stage: ActorStage = ActorStage.INIT
    node_id: str | None = None
    restart_count: int = 0
    total_failures: int = 0
    error: str | None = None
    errors_seen: int = Field(default=0, description="Pushed error reports already acted on.")
    memory: int | None = Field(
        default=None,
        description="Memory in bytes its incarnations ask Ray for instead of its role's (a memory relaunch).",
    )
    memory_raised_at: float | None = Field(
        default=None, description="When its last memory relaunch began (one per settle period)."
    )
    seat: str | None = Field(
        default=None,
        description="The bundle of its role's group it sits in instead of its planned place "
        "(`group#index`): one a relaunched actor left (`master.bundles`).",
    )

    def __setattr__(self, name: str, value: Any) -> None:
        """Assign; the JSON kept for the writer (`ENCODED`) is no longer the record's."""
        super().__setattr__(name, value)
        vars(self).pop(ENCODED, None)

    def model_copy(self, *, update: Mapping[str, Any] | None = None, deep: bool = False) -> Self:
        """A copy; one with changes keeps no JSON (`ENCODED`)."""
        copied = super().model_copy(update=update, deep=deep)
        if update:
            vars(copied).pop(ENCODED, None)
        return copied


class RoleRecord(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str
    restart_count: int = 0
    inplace_restart_count: int = 0
    sub_master_restart_count: int = 0
    escalation_count: int = Field(
        default=0,
        description="Role restarts since the last job-level restart; at escalate_after it goes global.",
    )
    resize_count: int = Field(default=0, description="Resizes begun (`dlu scale`), counted when saved.")
    target_nodes: int | None = Field(
        default=None, description="An elastic role's node count set by `dlu scale`; unset: its MAX."
    )
    last_resize_at: float | None = Field(
        default=None, description="When an elastic role's last resize ended (resize_interval_s)."
    )


class FailoverRecord(BaseModel):
    """A recovery that was decided and counted but may not have finished.

    Saved before acting, so a PrimeMaster that dies half way finishes it without counting it
    twice; cleared once done, on every path.
    """

    model_config = ConfigDict(extra="forbid")

    tier: Tier
    role: str | None = None
    actors: list[str] = Field(default_factory=list[str])
    reason: str
    started_at: float
    culprit: str | None = None
    alive: list[str] = Field(
        default_factory=list[str],
        description="Of `actors`, those alive as it began (marked, hung, failed): a death of one before it is "
        "replaced is a fault of its own, the others' deaths are the failover's.",
    )
    rebuilt: list[str] = Field(
        default_factory=list[str],
        description="Of `actors`, those it began for because Ray rebuilt them on a live node: one gone for good "
        "since, with the node it last ran on dead, was lost with that node (a fault of its own).",
    )


class ResizeRecord(BaseModel):
    """A resize of one role that was decided and saved but may not have finished.

    Saved before any actor is created or stopped, so a PrimeMaster that dies half way finishes
    it (creating what is missing, stopping what is left) without counting it twice. `nodes` is
    the elastic resize's slot (node count), unused for simple roles, whose size is an actor count.
    """

    model_config = ConfigDict(extra="forbid")

    role: str
    old_size: int
    new_size: int
    cause: str
    started_at: float
    added: list[str] = Field(default_factory=list[str])
    removed: list[str] = Field(default_factory=list[str])
    nodes: int | None = None
    request_id: str | None = Field(
        default=None, description="The `dlu scale` request that began it (its retries find it by this id)."
    )
    checked: list[int] = Field(
        default_factory=list[int],
        description="Added ranks whose node check passed: a PrimeMaster rebuilt half way does not check them again.",
    )


class RelaunchRecord(BaseModel):
    """A memory relaunch of one actor that was decided and saved but may not have finished: the
    actor is replaced with `new_memory` bytes (its record's `memory` already says so), or, once
    that failed (`error`), with `old_memory` again. Not a fault: nothing is counted; a
    PrimeMaster rebuilt half way replaces the actor again."""

    model_config = ConfigDict(extra="forbid")

    actor: str
    role: str
    old_memory: int
    new_memory: int
    reason: str
    started_at: float
    error: str | None = Field(
        default=None, description="Why it failed: the actor is being put back with its old memory."
    )
    seat: str | None = Field(default=None, description="The bundle it is seated in with the new memory.")
    old_seat: str | None = Field(default=None, description="Its seat before (put back on a failure).")


class RequestOutcome(BaseModel):
    """What a mutating CLI request (`dlu scale`, `dlu debug mark-unhealthy`) came to, kept by its
    request id, so a request retried after its PrimeMaster died is answered with the real
    outcome instead of run again."""

    model_config = ConfigDict(extra="forbid")

    action: str = "scale"
    role: str
    old_size: int = 0
    new_size: int = 0
    actors: list[str] = Field(default_factory=list[str])
    failed: bool = False
    message: str = ""
    verdict: str = Field(default="", description="An in-place report's verdict (action `inplace_restart`).")
    counted: bool = Field(default=False, description="Whether that in-place report was counted.")
    pending: bool = Field(
        default=False,
        description="A mark-unhealthy no monitoring pass has judged yet: a rebuilt PrimeMaster judges it.",
    )


MARK_ACTION = "mark_unhealthy"
"""A `RequestOutcome`'s action for `dlu debug mark-unhealthy` (pending until a pass judged it)."""

INPLACE_ACTION = "inplace_restart"
"""A `RequestOutcome`'s action for a rank's in-place report (its id is the SubMaster's)."""

MAX_REQUESTS = 32
"""Request outcomes kept (the oldest go first): a retry comes within seconds of its request."""


def remove_actor(state: JobState, name: str) -> None:
    """An actor leaves the job (a resize removed it): a mark still pending on it goes with it,
    so a rebuilt PrimeMaster never judges it on a later actor of the same name."""
    state.actors.pop(name, None)
    for outcome in state.requests.values():
        if outcome.pending and name in outcome.actors:
            outcome.pending = False


def remember_request(state: JobState, request_id: str, outcome: RequestOutcome) -> None:
    """Keep a request's outcome by its id (the oldest beyond MAX_REQUESTS go)."""
    state.requests[request_id] = outcome
    for old in list(state.requests)[: max(0, len(state.requests) - MAX_REQUESTS)]:
        del state.requests[old]


class ChannelRecord(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str
    kind: str  # "channel" or "shards"
    actor_name: str


def _now() -> float:
    return time.time()


class JobState(BaseModel):
    """The whole persisted state of one job run."""

    model_config = ConfigDict(extra="forbid")

    schema_version: int = SCHEMA_VERSION
    run_id: str = Field(default_factory=lambda: uuid.uuid4().hex)
    spec: JobSpec
    stage: JobStage = JobStage.INIT
    exit_code: int | None = None
    reason: str = ""
    roles: dict[str, RoleRecord] = Field(default_factory=dict[str, RoleRecord])
    actors: dict[str, ActorRecord] = Field(default_factory=dict[str, ActorRecord])
    job_restart_count: int = 0
    global_restart_count: int = 0
    master_restart_count: int = 0
    removed_nodes: list[str] = Field(default_factory=list[str])
    node_restart_count: int = 0
    node_failures: dict[str, int] = Field(default_factory=dict[str, int])
    failover: FailoverRecord | None = None
    resize: ResizeRecord | None = None
    relaunch: RelaunchRecord | None = Field(
        default=None, description="A memory relaunch in flight (`master.core.memory_chain`)."
    )
    relaunch_count: int = Field(default=0, description="Memory relaunches begun (not faults: no budget).")
    channels: dict[str, ChannelRecord] = Field(default_factory=dict[str, ChannelRecord])
    endpoints: dict[str, dict[str, str]] = Field(
        default_factory=dict[str, dict[str, str]],
        description="What SubMasters publish for their workers (e.g. the ElasticMaster's gRPC address).",
    )
    events: list[JobEvent] = Field(default_factory=list[JobEvent])
    event_seq: int = Field(
        default=0, description="The position of the last event recorded (events are 1, 2, ...)."
    )
    requests: dict[str, RequestOutcome] = Field(
        default_factory=dict[str, RequestOutcome],
        description="Outcomes of the last MAX_REQUESTS requests that carried an id, by id (idempotent retries).",
    )
    first_failure: JobEvent | None = Field(
        default=None, description="The job's first failure: its root cause, kept past MAX_EVENTS."
    )
    created_at: float = Field(default_factory=_now)
    updated_at: float = Field(default_factory=_now)

    @property
    def job(self) -> str:
        return self.spec.name

    def record(
        self,
        kind: EventKind,
        message: str,
        *,
        role: str | None = None,
        actor: str | None = None,
        node_id: str | None = None,
        at: float | None = None,
        tier: str | None = None,
        duration_s: float | None = None,
    ) -> JobEvent:
        """Append an event to the bounded timeline."""
        event = JobEvent(
            time=_now() if at is None else at,
            kind=kind,
            message=message,
            role=role,
            actor=actor,
            node_id=node_id,
            tier=tier,
            duration_s=duration_s,
            seq=self.event_seq + 1,
        )
        self.event_seq = event.seq
        if self.first_failure is None and kind in FAILURE_EVENTS:
            self.first_failure = event
        self.events.append(event)
        if len(self.events) > MAX_EVENTS:
            del self.events[: len(self.events) - MAX_EVENTS]
        return event

    def to_status(self, events: int = 50, events_after: int | None = None) -> JobStatus:
        """The job's status with its last `events` events, or, given `events_after`, every
        retained event past that position (a client's cursor: none is skipped however many).
        Its free bundles are `master.job_status`'s to add."""
        roles: list[RoleStatus] = []
        for spec_role in self.spec.roles:
            record = self.roles.get(spec_role.name)
            members = [a for a in self.actors.values() if a.role == spec_role.name]
            workers = [a for a in members if a.rank != SUB_MASTER_RANK]
            done = bool(workers) and all(a.stage is ActorStage.FINISH for a in workers)
            actors = [
                ActorStatus(
                    name=a.name,
                    role=a.role,
                    rank=a.rank,
                    # A SubMaster lives on until the job ends; once its workers finished it drives nothing.
                    stage=ActorStage.FINISH.value
                    if done and a.stage is ActorStage.RUNNING
                    else a.stage.value,
                    node_id=a.node_id,
                    restart_count=a.restart_count,
                    memory_limit_bytes=a.memory,
                )
                for a in members
            ]
            nodes: dict[str, int | None] = {}
            elastic = spec_role.elastic
            if elastic is not None:
                have = len({a.rank // spec_role.per_group for a in workers})
                target = record.target_nodes if record is not None and record.target_nodes else None
                nodes = {
                    "nodes": have,
                    "min_nodes": elastic.min_nodes,
                    "max_nodes": elastic.max_nodes,
                    "pending_nodes": max(0, (target or elastic.max_nodes) - have),
                }
            roles.append(
                RoleStatus(
                    **nodes,
                    name=spec_role.name,
                    kind=spec_role.kind.value,
                    restart_count=record.restart_count if record else 0,
                    inplace_restart_count=record.inplace_restart_count if record else 0,
                    sub_master_restart_count=record.sub_master_restart_count if record else 0,
                    size=role_size(self, spec_role.name),
                    resize_count=record.resize_count if record else 0,
                    actors=sorted(actors, key=lambda a: a.rank),
                )
            )
        return JobStatus(
            name=self.job,
            stage=self.stage,
            exit_code=self.exit_code,
            reason=self.reason,
            job_restart_count=self.job_restart_count,
            global_restart_count=self.global_restart_count,
            master_restart_count=self.master_restart_count,
            node_restart_count=self.node_restart_count,
            removed_nodes=list(self.removed_nodes),
            roles=roles,
            events=self._events(events, events_after),
            first_failure=self.first_failure,
            run_id=self.run_id,
            log_dir=self.spec.logs.dir,
        )

    def _events(self, tail: int, after: int | None) -> list[JobEvent]:
        if after is not None:
            return [e for e in self.events if e.seq > after]
        return self.events[-tail:] if tail else []

    def dumps(self) -> bytes:
        return self.model_dump_json().encode()

    @classmethod
    def loads(cls, data: bytes) -> JobState:
        """Parse a stored document, upgrading one an older dlu-prime wrote (see `schema`).

        Raises:
            SchemaVersionError: a newer dlu-prime wrote it, or it is not a state document.
            ValueError: the document does not fit the schema it claims.
        """
        raw: Any = json.loads(data)
        document: dict[str, Any] = raw if isinstance(raw, dict) else {}  # pyright: ignore[reportUnknownVariableType]
        return cls.model_validate(upgrade(document))
