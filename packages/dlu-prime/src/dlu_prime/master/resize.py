"""Scaling a role by hand (`dlu scale JOB ROLE N`): the policy and the state changes, both pure.

`plan_resize` judges a request against the spec and the state and says which actors to add or
stop; `ResizeBegan` saves that plan as the job's in-flight `resize` record (counted once, before
any actor is touched) and adds the new actors' records; `ResizeEnded` drops the stopped actors'
records and clears the in-flight record. The decision core's resize chain
(`core/resize_chain.py`) decides the steps in between, the executor runs them, and a saved
resize is finished the same way after a PrimeMaster restart.

Simple roles are resized one actor per rank (surplus ranks stop highest first). Elastic roles
with a MIN:MAX range are resized a node at a time (`elastic_policy`): their plans and records
carry `nodes`, the node count after the resize, and their sizes are node counts.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from dlu_api.spec.models import RoleKind
from dlu_api.status import JobStage
from dlu_api.vocabulary import ActorStage, EventKind
from dlu_prime.master.resize_plan import SETS_TARGET, ResizePlan, ScaleError, StartedWithout
from dlu_prime.master.state import (
    SUB_MASTER_RANK,
    ActorRecord,
    JobState,
    RequestOutcome,
    ResizeRecord,
    remember_request,
    remove_actor,
    role_size,
)
from dlu_prime.naming import actor_name

__all__ = [
    "FellBelowMin",
    "ResizeBegan",
    "ResizeChecked",
    "ResizeEnded",
    "ResizePlan",
    "ScaleError",
    "StartedWithout",
    "TargetSet",
    "extra_ranks",
    "plan_resize",
    "resizing",
]

EventSpec = tuple[EventKind, str, float | None]
"""(kind, message, duration_s) of an event a resize change records."""


@dataclass(frozen=True)
class ResizeBegan:
    """A resize decided and saved in flight, before any actor is created or stopped."""

    plan: ResizePlan
    cause: str = "dlu scale"
    forgiven: int = 0  # in-place restarts of the role that were this node loss's effect: uncounted
    request_id: str | None = None  # the `dlu scale` request that asked for it (idempotent retries)


@dataclass(frozen=True)
class ResizeEnded:
    """The in-flight resize is over, on every path; `error` when it failed. `requeued`: shard
    queue -> the shard ids the stopped actors held, handed back to the queue's todo."""

    error: str | None = None
    requeued: Mapping[str, Sequence[int]] = field(default_factory=dict[str, Sequence[int]])


@dataclass(frozen=True)
class ResizeChecked:
    """The in-flight resize's new ranks passed their node check: saved, so a PrimeMaster
    rebuilt from here on does not check them again."""

    ranks: Sequence[int]


def resize_checked(state: JobState, change: ResizeChecked) -> None:
    if state.resize is not None:
        state.resize.checked = sorted({*state.resize.checked, *change.ranks})


@dataclass(frozen=True)
class FellBelowMin:
    """An elastic role lost nodes below its MIN and no capacity came back in time: the lost
    node's actor `culprit` is the one fault counted (the in-place restarts of the survivors it
    caused are not), before the job stops."""

    role: str
    culprit: str
    message: str
    forgiven: int = 0


def fell_below_min(state: JobState, change: FellBelowMin) -> list[EventSpec]:
    record = state.actors[change.culprit]
    record.total_failures += 1
    record.error = change.message
    record.stage = ActorStage.FAILED
    role = state.roles[change.role]
    role.inplace_restart_count -= min(change.forgiven, role.inplace_restart_count)
    return [(EventKind.DIED, change.message, None)]


def started_without(state: JobState, change: StartedWithout) -> list[EventSpec]:
    for name in change.names:
        remove_actor(state, name)
    return [(EventKind.ELASTIC_START, change.message, None)]


@dataclass(frozen=True)
class TargetSet:
    """`dlu scale` asked an elastic role for the node count it has: nothing to resize, but the
    role keeps that count from now on (no growth back to MAX)."""

    role: str
    nodes: int


def target_set(state: JobState, change: TargetSet) -> list[EventSpec]:
    record = state.roles[change.role]
    if record.target_nodes == change.nodes:
        return []
    record.target_nodes = change.nodes
    return [(EventKind.RESIZE_TARGET, f"keeps {change.nodes} node(s) (dlu scale)", None)]


def plan_resize(state: JobState, role: str, size: int) -> ResizePlan:
    """Judge `dlu scale JOB ROLE SIZE` against the spec and the state. Pure.

    Raises:
        ScaleError: the job is not running, a resize or failover is in flight, the role is
            unknown, custom, collocated or not resizable, or the size is out of bounds (for an
            elastic role a node count outside MIN..MAX).
    """
    job = state.job
    if state.stage is not JobStage.RUNNING:
        raise ScaleError(f"job {job} is {state.stage.value}, not RUNNING: only a running job can be scaled")
    names = [r.name for r in state.spec.roles]
    if role not in names:
        raise ScaleError(f"job {job} has no role {role!r}; its roles are {', '.join(names)}")
    spec = state.spec.role(role)
    if spec.kind is not RoleKind.SIMPLE and spec.kind is not RoleKind.ELASTIC:
        raise ScaleError(
            f"role {role!r} of job {job} is {spec.kind.value}: only simple and elastic roles can be scaled"
        )
    if not spec.resizable:
        raise ScaleError(
            f"role {role!r} of job {job} is not resizable (resizable: false in its spec); "
            "set resizable: true and submit the job again to scale it"
        )
    if spec.kind is RoleKind.ELASTIC:
        return _elastic_plan(state, role, size)
    together = state.spec.collocation_of(role)
    if together is not None:
        mates = ", ".join(state.spec.collocations[together].roles)
        raise ScaleError(
            f"role {role!r} of job {job} is collocated ({mates}): collocated roles share bundles and "
            "keep the size of their spec; take it out of `collocations` to scale it"
        )
    if isinstance(size, bool) or not isinstance(size, int) or size < 1:
        raise ScaleError(f"size {size!r} for role {role!r} is not allowed: give a whole number >= 1")
    if spec.max_total is not None and size > spec.max_total:
        raise ScaleError(
            f"size {size} for role {role!r} is above its max_total={spec.max_total}: give at most "
            f"{spec.max_total}, or raise roles[{role}].max_total and submit the job again"
        )
    _not_busy(state)
    ranks = sorted(a.rank for a in state.actors.values() if a.role == role and a.rank != SUB_MASTER_RANK)
    old = len(ranks)
    if size >= old:
        free = [r for r in range(size + len(ranks)) if r not in set(ranks)][: size - old]
        added = tuple((actor_name(job, role, r), r) for r in free)
        return ResizePlan(role, old, size, added=added)
    by_rank = {a.rank: n for n, a in state.actors.items() if a.role == role and a.rank != SUB_MASTER_RANK}
    removed = tuple(by_rank[r] for r in sorted(ranks, reverse=True)[: old - size])
    return ResizePlan(role, old, size, removed=removed)


def _elastic_plan(state: JobState, role: str, size: int) -> ResizePlan:
    from dlu_prime.master.elastic_policy import plan_elastic_scale  # it builds on this module

    if state.spec.collocation_of(role) is not None:
        raise ScaleError(
            f"role {role!r} of job {state.job} is collocated: collocated roles keep the size of their "
            "spec; take it out of `collocations` to scale it"
        )
    plan = plan_elastic_scale(state, role, size)
    if plan.added or plan.removed:
        _not_busy(state)
    return plan


def _not_busy(state: JobState) -> None:
    job = state.job
    if state.resize is not None:
        busy = state.resize
        raise ScaleError(
            f"job {job} is already resizing role {busy.role!r} ({busy.old_size} -> {busy.new_size}); "
            "try again when it is done (`dlu status` shows the sizes)"
        )
    if state.failover is not None:
        raise ScaleError(f"job {job} is recovering from a failure; try `dlu scale` again when it is done")


def resize_began(state: JobState, change: ResizeBegan, now: float) -> list[EventSpec]:
    """Save the plan in flight, count it, and add the new actors' records (INIT, not started)."""
    plan = change.plan
    state.resize = ResizeRecord(
        role=plan.role,
        old_size=plan.old_size,
        new_size=plan.new_size,
        cause=change.cause,
        started_at=now,
        added=[name for name, _ in plan.added],
        removed=list(plan.removed),
        nodes=plan.nodes,
        request_id=change.request_id,
    )
    role = state.roles[plan.role]
    role.resize_count += 1
    forgiven = min(change.forgiven, role.inplace_restart_count)
    role.inplace_restart_count -= forgiven
    if plan.nodes is not None and change.cause in SETS_TARGET:
        role.target_nodes = plan.nodes  # the role aims at this node count from now on
    for name, rank in plan.added:
        state.actors.setdefault(name, ActorRecord(name=name, role=plan.role, rank=rank))
    uncounted = f"; {forgiven} in-place restart(s) it caused not counted" if forgiven else ""
    return [(EventKind.RESIZE_STARTED, f"{_what(state, state.resize)} ({change.cause}{uncounted})", None)]


def _what(state: JobState, record: ResizeRecord) -> str:
    """'resize 2 -> 1 node(s), world 4 -> 2' for an elastic role; 'resize 2 -> 6' for a simple one."""
    if record.nodes is None:
        return f"resize {record.old_size} -> {record.new_size}"
    per = state.spec.role(record.role).per_group
    return (
        f"resize {record.old_size} -> {record.new_size} node(s), "
        f"world {record.old_size * per} -> {record.new_size * per}"
    )


def resize_ended(state: JobState, change: ResizeEnded, now: float) -> list[EventSpec]:
    """Clear the in-flight record. Stopped actors leave the state; so do added ones on failure,
    since the runner removed them again (the role keeps its old size)."""
    record = state.resize
    if record is None:
        return []
    state.resize = None
    gone: Sequence[str] = record.removed if change.error is None else [*record.added, *record.removed]
    for name in gone:
        remove_actor(state, name)
    took = now - record.started_at
    if record.nodes is not None:
        state.roles[record.role].last_resize_at = now
    what = f"{_what(state, record)} ({record.cause})"
    handed_back: list[EventSpec] = [
        (
            EventKind.SHARDS_REQUEUED,
            f"shard queue {queue!r}: shards {list(ids)} of stopped actors back in todo",
            None,
        )
        for queue, ids in sorted(change.requeued.items())
        if ids
    ]
    if change.error is None:
        ended: EventSpec = (EventKind.RESIZE_DONE, f"{what} done in {took:.2f}s", took)
    else:
        size = role_size(state, record.role)
        if record.nodes is not None:
            size = size // state.spec.role(record.role).per_group
        ended = (
            EventKind.RESIZE_FAILED,
            f"{what} failed after {took:.2f}s, role left at {size}: {change.error}",
            took,
        )
    if record.request_id is not None:
        outcome = RequestOutcome(
            role=record.role,
            old_size=record.old_size,
            new_size=record.new_size,
            failed=change.error is not None,
            message=ended[1],
        )
        remember_request(state, record.request_id, outcome)
    return [*handed_back, ended]


def resizing(state: JobState) -> set[str]:
    """Actors an in-flight resize is creating or stopping: the monitor does not judge them."""
    record = state.resize
    return set() if record is None else {*record.added, *record.removed}


def extra_ranks(state: JobState) -> dict[str, list[int]]:
    """Ranks of each simple role beyond its spec total (added by earlier resizes)."""
    out: dict[str, list[int]] = {}
    for record in state.actors.values():
        total = state.spec.role(record.role).total
        if record.rank != SUB_MASTER_RANK and record.rank >= total:
            out.setdefault(record.role, []).append(record.rank)
    return out
