"""The changes to a job's state, as data: what the PrimeManager decided, not yet applied.

`dlu_prime.master.changes.apply_change` applies them (and `changes` re-exports these types).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from dlu_api.status import JobStage
from dlu_api.vocabulary import ActorStage, EventKind, InPlaceDecision, Tier
from dlu_prime.master.bundles import ActorsSeated
from dlu_prime.master.failover import Recovery
from dlu_prime.master.monitor import Assessment
from dlu_prime.master.relaunch import RelaunchBegan, RelaunchEnded, RelaunchFailed
from dlu_prime.master.resize import (
    FellBelowMin,
    ResizeBegan,
    ResizeChecked,
    ResizeEnded,
    StartedWithout,
    TargetSet,
)
from dlu_prime.master.state import FailoverRecord


@dataclass(frozen=True)
class Note:
    """Only an event on the timeline."""

    kind: EventKind
    message: str
    role: str | None = None
    actor: str | None = None
    node_id: str | None = None
    tier: Tier | None = None
    duration_s: float | None = None


@dataclass(frozen=True)
class StageChanged:
    """The job's stage (checked against the allowed moves by the caller)."""

    stage: JobStage
    reason: str = ""
    exit_code: int | None = None


@dataclass(frozen=True)
class ActorsPlaced:
    """Actors (re)created on these nodes; `stage` set when they passed their self check."""

    nodes: Mapping[str, str | None]
    stage: ActorStage | None = None
    fresh: bool = False  # replacements: their pushed-error count starts again
    note: Note | None = None


@dataclass(frozen=True)
class ActorsRestarting:
    """A SubMaster asked for these actors to be replaced; `counted` unless its failover already was."""

    names: Sequence[str]
    reason: str
    counted: bool


@dataclass(frozen=True)
class ActorsStaged:
    names: Sequence[str]
    stage: ActorStage
    error: str | None = None


@dataclass(frozen=True)
class Observed:
    """One monitoring pass as judged by `assess`."""

    assessment: Assessment


@dataclass(frozen=True)
class FailuresCounted:
    """Per-node failure counts of a failover plan, and its notes (a node over its limit)."""

    node_failures: Mapping[str, int]
    notes: Sequence[str] = ()


@dataclass(frozen=True)
class FailoverBegan:
    """A recovery counted (unless it joins another fault's) and saved in flight before acting."""

    recovery: Recovery
    escalated: bool = False
    widens: tuple[str, ...] = ()  # a waiting role failover's actors, recovered with it (uncounted)
    tier: Tier | None = None  # the saved record's tier, where widening a SubMaster one keeps it


@dataclass(frozen=True)
class FailoverEnded:
    """The in-flight recovery is over, on every path; `error` when it failed."""

    record: FailoverRecord
    error: str | None = None


@dataclass(frozen=True)
class SetupRetried:
    """An actor Ray rebuilt during the checks is checked again: counted like a restart."""

    recovery: Recovery


@dataclass(frozen=True)
class InPlaceJudged:
    """A failed training process, judged by `judge_inplace`."""

    role: str
    agent: str | None
    message: str
    decision: InPlaceDecision
    report_id: str | None = None  # remembered with the decision: a retry is answered from it


@dataclass(frozen=True)
class NodesRemoved:
    nodes: Sequence[str]


@dataclass(frozen=True)
class NodesRelaunched:
    nodes: Sequence[str]
    replaced_by: Sequence[str]
    duration_s: float


@dataclass(frozen=True)
class MasterRestarted:
    pass


@dataclass(frozen=True)
class ChannelRegistered:
    name: str
    kind: str
    actor_name: str


@dataclass(frozen=True)
class EndpointPublished:
    key: str
    value: Mapping[str, str]


@dataclass(frozen=True)
class ActorsClosed:
    """The job ended: what still ran is recorded STOPPED."""


Change = (
    Note
    | StageChanged
    | ActorsPlaced
    | ActorsRestarting
    | ActorsStaged
    | Observed
    | FailuresCounted
    | FailoverBegan
    | FailoverEnded
    | SetupRetried
    | InPlaceJudged
    | NodesRemoved
    | NodesRelaunched
    | MasterRestarted
    | ChannelRegistered
    | EndpointPublished
    | ActorsClosed
    | ResizeBegan
    | ResizeEnded
    | StartedWithout
    | TargetSet
    | FellBelowMin
    | ResizeChecked
    | RelaunchBegan
    | RelaunchFailed
    | RelaunchEnded
    | ActorsSeated
)
