"""Every change to a job's state, as data (`change_types`, re-exported here), and the one
function that applies it.

The PrimeManager decides (pure policies), describes what follows as changes, and hands them to
`PrimeManager.apply`, the only code that changes the state: it calls `apply_change` for each,
saves once, then lets its hooks (events, metrics) see what changed. A change is applied to the
state in memory, under the manager's lock; `apply_change` itself does no I/O, so what a change
does is testable on a bare `JobState`.
"""

from __future__ import annotations

from collections.abc import Callable

from dlu_api.status import JobEvent
from dlu_api.vocabulary import ActorStage, EventKind, FailureKind, InPlaceVerdict, Tier
from dlu_prime.master.bundles import ActorsSeated, actors_seated
from dlu_prime.master.change_types import (
    ActorsClosed,
    ActorsPlaced,
    ActorsRestarting,
    ActorsStaged,
    Change,
    ChannelRegistered,
    EndpointPublished,
    FailoverBegan,
    FailoverEnded,
    FailuresCounted,
    InPlaceJudged,
    MasterRestarted,
    NodesRelaunched,
    NodesRemoved,
    Note,
    Observed,
    SetupRetried,
    StageChanged,
)
from dlu_prime.master.failover import Recovery
from dlu_prime.master.monitor import Assessment
from dlu_prime.master.relaunch import (
    RelaunchBegan,
    RelaunchEnded,
    RelaunchFailed,
    relaunch_began,
    relaunch_ended,
    relaunch_failed,
)
from dlu_prime.master.resize import (
    FellBelowMin,
    ResizeBegan,
    ResizeChecked,
    ResizeEnded,
    StartedWithout,
    TargetSet,
    fell_below_min,
    resize_began,
    resize_checked,
    resize_ended,
    started_without,
    target_set,
)
from dlu_prime.master.state import (
    INPLACE_ACTION,
    MARK_ACTION,
    ChannelRecord,
    FailoverRecord,
    JobState,
    RequestOutcome,
    close_actors,
    remember_request,
)
from dlu_prime.master.tiers import charge

# The change types live in `change_types`; callers import them from here, with `apply_change`.
__all__ = [
    "DEATHS",
    "ActorsClosed",
    "ActorsPlaced",
    "ActorsRestarting",
    "ActorsStaged",
    "Change",
    "ChannelRegistered",
    "EndpointPublished",
    "FailoverBegan",
    "FailoverEnded",
    "FailuresCounted",
    "InPlaceJudged",
    "MasterRestarted",
    "NodesRelaunched",
    "NodesRemoved",
    "Note",
    "Observed",
    "RelaunchBegan",
    "RelaunchEnded",
    "RelaunchFailed",
    "SetupRetried",
    "StageChanged",
    "apply_change",
    "count",
]

_NoteFn = Callable[["Note"], None]
DEATHS = ("died", "restarted", "unavailable")  # failures after which the actor's process is gone


def apply_change(state: JobState, change: Change, now: float) -> list[JobEvent]:
    """Change `state` as `change` says; return the events recorded. No I/O."""
    out: list[JobEvent] = []

    def note(n: Note) -> None:
        out.append(
            state.record(
                n.kind,
                n.message,
                role=n.role,
                actor=n.actor,
                node_id=n.node_id,
                tier=n.tier,
                duration_s=n.duration_s,
                at=now,
            )
        )

    match change:
        case Note():
            note(change)
        case StageChanged(stage=stage, reason=reason, exit_code=code):
            current = state.stage
            state.stage = stage
            if reason:
                state.reason = reason
            if code is not None:
                state.exit_code = code
            first = reason.splitlines()[0] if reason else ""
            note(Note(EventKind.STAGE, f"{current.value} -> {stage.value}" + (f": {first}" if first else "")))
        case ActorsPlaced():
            for name, node in change.nodes.items():
                record = state.actors.get(name)
                if record is None:
                    continue
                record.node_id = node
                if change.stage is not None:
                    record.stage = change.stage
                if change.fresh:
                    record.errors_seen = 0
            if change.note is not None:
                note(change.note)
        case ActorsRestarting(names=names, reason=reason, counted=counted):
            if counted:
                for role in sorted({state.actors[n].role for n in names}):
                    state.roles[role].restart_count += 1
            for name in names:
                if counted:
                    state.actors[name].restart_count += 1
                state.actors[name].stage = ActorStage.INIT
            note(Note(EventKind.ACTORS_RESTARTING, f"{', '.join(names)}: {reason}"))
        case ActorsStaged(names=names, stage=stage, error=error):
            for name in names:
                record = state.actors.get(name)
                if record is not None:
                    record.stage = stage
                    if error is not None:
                        record.error = error
        case Observed(assessment=result):
            _observed(state, result, note)
        case FailuresCounted(node_failures=counts, notes=notes):
            state.node_failures = dict(counts) or state.node_failures
            for text in notes:
                note(Note(EventKind.NODE_LIMIT, text))
        case FailoverBegan(recovery=recovery, escalated=escalated, widens=widens, tier=tier):
            _began(state, recovery, escalated, now, note, widens, tier)
        case FailoverEnded(record=record, error=error):
            state.failover = None
            what = f"{record.tier.value} failover"
            if error is None:
                took = now - record.started_at
                done = f"{what} of {', '.join(record.actors)} done in {took:.2f}s"
                note(Note(EventKind.FAILOVER_DONE, done, role=record.role, tier=record.tier, duration_s=took))
            else:
                note(
                    Note(
                        EventKind.FAILOVER_FAILED,
                        f"{what} failed: {error}",
                        role=record.role,
                        tier=record.tier,
                    )
                )
        case SetupRetried(recovery=recovery):
            count(state, recovery)
            role, actor, tier = recovery.role, recovery.culprit, recovery.tier
            note(
                Note(
                    EventKind.FAILOVER_STARTED,
                    f"{tier.value} failover: {recovery.reason}",
                    role,
                    actor,
                    tier=tier,
                )
            )
            note(
                Note(EventKind.FAILOVER_DONE, f"{actor} set up again", role, actor, tier=tier, duration_s=0.0)
            )
        case InPlaceJudged():
            _inplace(state, change, note)
        case NodesRemoved(nodes=nodes):
            for node in nodes:
                if node not in state.removed_nodes:
                    state.removed_nodes.append(node)
            note(
                Note(
                    EventKind.NODE_RELAUNCH,
                    f"relaunching node(s) {', '.join(n[:12] for n in nodes)}",
                    tier=Tier.NODE,
                )
            )
        case NodesRelaunched(nodes=nodes, replaced_by=replaced, duration_s=took):
            for node in nodes:
                charge(state, Tier.NODE)
                state.node_failures[node] = 0
            limit = state.spec.limits.node_max_restart
            by = ", ".join(n[:12] for n in replaced) or "none"
            message = f"{len(nodes)} node(s) replaced by {by} ({state.node_restart_count}/{limit})"
            note(Note(EventKind.NODE_RELAUNCHED, message, tier=Tier.NODE, duration_s=took))
        case MasterRestarted():
            charge(state, Tier.MASTER)
            in_flight = f"; {state.failover.tier.value} failover in flight" if state.failover else ""
            limit = state.spec.limits.master_max_restart
            message = (
                f"PrimeMaster reconstructed in stage {state.stage.value}{in_flight} "
                f"({state.master_restart_count}/{limit})"
            )
            note(Note(EventKind.MASTER_RESTARTED, message, tier=Tier.MASTER))
        case ChannelRegistered(name=name, kind=kind, actor_name=actor_name):
            if name not in state.channels:
                state.channels[name] = ChannelRecord(name=name, kind=kind, actor_name=actor_name)
                note(Note(EventKind.CHANNEL_CREATED, f"{kind} {name!r} created"))
        case EndpointPublished(key=key, value=value):
            if state.endpoints.get(key) != dict(value):
                state.endpoints[key] = dict(value)
                note(Note(EventKind.ENDPOINT_PUBLISHED, f"{key} published at {value.get('address', '?')}"))
        case ActorsClosed():
            close_actors(state)
        case ResizeBegan():
            for kind, message, took in resize_began(state, change, now):
                note(Note(kind, message, role=change.plan.role, duration_s=took))
        case ResizeEnded():
            role = state.resize.role if state.resize is not None else None
            for kind, message, took in resize_ended(state, change, now):
                note(Note(kind, message, role=role, duration_s=took))
        case StartedWithout():
            for kind, message, _ in started_without(state, change):
                note(Note(kind, message))
        case TargetSet():
            for kind, message, _ in target_set(state, change):
                note(Note(kind, message, role=change.role))
        case ResizeChecked():
            resize_checked(state, change)
        case RelaunchBegan(record=record):
            for kind, message, took in relaunch_began(state, change):
                note(Note(kind, message, role=record.role, actor=record.actor, duration_s=took))
        case RelaunchFailed() | RelaunchEnded():
            record = state.relaunch
            lines = (
                relaunch_failed(state, change)
                if isinstance(change, RelaunchFailed)
                else relaunch_ended(state, change, now)
            )
            for kind, message, took in lines:
                role, actor = (record.role, record.actor) if record is not None else (None, None)
                note(Note(kind, message, role=role, actor=actor, duration_s=took))
        case ActorsSeated():
            for kind, message in actors_seated(state, change):
                note(Note(kind, message))
        case FellBelowMin():
            node = state.actors[change.culprit].node_id
            for kind, message, _ in fell_below_min(state, change):
                note(Note(kind, message, role=change.role, actor=change.culprit, node_id=node))
    return out


def count(state: JobState, recovery: Recovery) -> None:
    """Charge a recovery to its budget: the job's, the SubMaster's, or its role's and actors'."""
    if recovery.tier is Tier.JOB or recovery.role is not None:
        charge(state, recovery.tier, recovery.role, recovery.actors)


def _observed(state: JobState, result: Assessment, note: _NoteFn) -> None:
    for name, node in result.node_changes.items():
        state.actors[name].node_id = node
    for name, stage in result.stage_changes.items():
        state.actors[name].stage = stage
    for name, seen in result.errors_seen.items():
        state.actors[name].errors_seen = seen
    reported = {f.actor for f in result.failures if f.kind == FailureKind.ERROR_REPORT}
    for outcome in state.requests.values() if reported else ():
        if outcome.pending and outcome.action == MARK_ACTION and reported & set(outcome.actors):
            outcome.pending = False  # judged by this pass (saved with the recovery it begins)
    for failure in result.failures:
        record = state.actors[failure.actor]
        record.total_failures += 1
        record.error = failure.message
        if failure.kind in DEATHS:
            record.stage = ActorStage.FAILED
        lines = failure.message.strip()
        last = lines.splitlines()[-1] if lines else failure.kind
        note(
            Note(
                EventKind(failure.kind), last, role=failure.role, actor=failure.actor, node_id=failure.node_id
            )
        )
    for role in result.finished_roles:
        if not any(e.kind == "role_finished" and e.role == role for e in state.events):
            note(Note(EventKind.ROLE_FINISHED, "every actor finished", role=role))


def _began(
    state: JobState,
    recovery: Recovery,
    escalated: bool,
    now: float,
    note: _NoteFn,
    widens: tuple[str, ...],
    tier: Tier | None = None,
) -> None:
    waiting = state.failover
    if not recovery.joined:
        count(state, recovery)  # what `widens` adds was counted when its own failover began
    state.failover = FailoverRecord(
        tier=tier or recovery.tier,
        role=recovery.role,
        actors=[*recovery.actors, *widens],
        reason=recovery.reason,
        started_at=now,
        culprit=recovery.culprit,
        alive=[*recovery.alive, *(n for n in widens if waiting is not None and n in waiting.alive)],
        rebuilt=[*recovery.rebuilt, *(n for n in widens if waiting is not None and n in waiting.rebuilt)],
    )
    for name in recovery.actors:
        state.actors[name].stage = ActorStage.INIT
    kind = (
        EventKind.FAILOVER_ESCALATED
        if escalated
        else EventKind.FAILOVER_JOINED
        if recovery.joined
        else EventKind.FAILOVER_STARTED
    )
    message = f"{recovery.tier.value} failover of {', '.join(recovery.actors)}: {recovery.reason}"
    if widens:
        what = waiting.tier.value if waiting is not None else "role"
        message += f" (with {', '.join(widens)}, whose {what} failover was in flight)"
    note(Note(kind, message, recovery.role, recovery.culprit, recovery.node_id, recovery.tier))


def _inplace(state: JobState, change: InPlaceJudged, note: _NoteFn) -> None:
    role, agent, decision = change.role, change.agent, change.decision
    if change.report_id is not None:  # saved with the count: a retry is answered, not counted
        outcome = RequestOutcome(
            action=INPLACE_ACTION,
            role=role,
            actors=[agent] if agent else [],
            message=decision.reason,
            verdict=str(decision.verdict),
            counted=decision.counted,
        )
        remember_request(state, change.report_id, outcome)
    record = state.actors.get(agent or "")
    node = record.node_id if record is not None else None
    if decision.verdict is not InPlaceVerdict.STOP and decision.counted:
        charge(state, Tier.IN_PLACE, role)
        counted = state.roles[role].inplace_restart_count
        limit = state.spec.role(role).max_restart
        joined = f" ({decision.reason})" if decision.verdict is InPlaceVerdict.JOIN else ""
        message = f"restart {counted}/{limit}: {change.message}{joined}"
        note(Note(EventKind.INPLACE_RESTART, message, role, agent, node, Tier.IN_PLACE))
    elif decision.verdict is InPlaceVerdict.JOIN:
        note(Note(EventKind.JOINED_RECOVERY, decision.reason, role, agent, node))
    else:
        note(Note(EventKind.RESTART_LIMIT, decision.reason, role, agent, tier=Tier.IN_PLACE))
