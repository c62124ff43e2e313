"""A resize as a chain of decisions, one per step's outcome, like the failover chain.

scale request:  plan_resize -> ResizeBegan (saved, `resize_started` at once) [+ KnowActors], Wake
simple role:    [ActorsSeated, SetSeats] AddActors -> StartActors -> RemoveActors -> RequeueShards -> ResizeEnded
elastic role:   DropActors | RemoveActors + RemoveNodeGroups -> FindPlacedNodes -> AddActors
                -> CheckNodes (ResizeChecked saved) -> ReformTraining -> ResizeEnded, ForgetLiveness
a failed step:  RemoveActors(added, undo) -> ResizeEnded(error)
SubMaster away: the resize waits in flight (`resize_waiting`, said once), never fails

The resize in flight is saved (`state.resize`) before its first step, so a PrimeMaster rebuilt
half way starts its steps again (`resume`, each idempotent: what exists is adopted, what was
checked is not checked again) without counting it twice. A request id saved with it makes a
retried `dlu scale` find it (`request_seen`).
"""

from __future__ import annotations

from dlu_api.vocabulary import ActorStage, EventKind
from dlu_prime.master.bundles import ActorsSeated, growth_seats
from dlu_prime.master.change_types import ActorsPlaced, Note
from dlu_prime.master.core.commands import (
    AddActors,
    CheckNodes,
    Command,
    DropActors,
    FindPlacedNodes,
    ForgetLiveness,
    KnowActors,
    Purpose,
    ReformTraining,
    RemoveActors,
    RemoveNodeGroups,
    RequeueShards,
    SetSeats,
    StartActors,
    Wake,
)
from dlu_prime.master.core.decision import Decision
from dlu_prime.master.core.events import Done, ScaleRequested
from dlu_prime.master.elastic_policy import BY_HAND, NODE_LOST
from dlu_prime.master.lifecycle import start_targets
from dlu_prime.master.resize import ResizeBegan, ResizeChecked, ResizeEnded, TargetSet, plan_resize
from dlu_prime.master.resize_plan import ScaleError, SubMasterAway
from dlu_prime.master.state import SUB_MASTER_RANK, JobState, RequestOutcome, ResizeRecord
from dlu_prime.naming import sub_master_name

REFORM_TIMEOUT_S = 120.0  # the new round at the new world: every rank stops and joins again


def scale_requested(state: JobState, event: ScaleRequested) -> Decision:
    """Judge the request and save the resize in flight at once (so `dlu status` shows it
    started); the loop carries it out. The size the role has already: nothing saved or counted,
    but `dlu scale` makes an elastic role keep that node count."""
    try:
        plan = plan_resize(state, event.role, event.size)
    except ScaleError as exc:
        return Decision(error=exc)
    if not plan.added and not plan.removed:
        keep = plan.nodes is not None and event.cause == BY_HAND
        return Decision((TargetSet(event.role, plan.nodes),) if keep and plan.nodes else (), reply=plan)
    began = ResizeBegan(plan, event.cause, request_id=event.request_id)
    if plan.nodes is not None:
        return Decision((began,), (Wake(),), reply=plan)
    know = KnowActors(plan.role, tuple(rank for _, rank in plan.added), plan.new_size)
    return Decision((began,), (know, Wake()), reply=plan)


def request_seen(state: JobState, request_id: str) -> RequestOutcome | ResizeRecord | None:
    """A request seen before: its outcome, or its resize still in flight; None if new."""
    if request_id in state.requests:
        return state.requests[request_id]
    if state.resize is not None and state.resize.request_id == request_id:
        return state.resize
    return None


def resume(state: JobState) -> Decision:
    """The saved resize in flight, from its first step."""
    record = state.resize
    if record is None:
        return Decision()
    if record.nodes is None:
        return _simple_add(state, record)
    if record.removed and record.cause.startswith(NODE_LOST):
        return _run(DropActors(tuple(record.removed)))  # gone with their node: no stop call
    if record.removed:
        return _run(RemoveActors(tuple(record.removed)))
    return _elastic_join(state, record)


def after(state: JobState, done: Done) -> Decision:
    """The outcome of one step of the resize in flight."""
    record = state.resize
    command = done.command
    if record is None:
        return Decision(error=done.error) if isinstance(command, KnowActors) else Decision()
    if isinstance(command, KnowActors):
        return Decision(error=done.error)
    if isinstance(command, RemoveActors) and command.undo is not None:
        log = (f"removing the actors of a failed resize failed: {done.error_text}",) if done.failed else ()
        return _ended(state, record, command.undo).then(Decision(log=log))
    if isinstance(done.error, SubMasterAway):
        return _waits(state, record, str(done.error))
    if done.error is not None:
        return _failed(state, record, done.error_text)
    elastic = record.nodes is not None
    match command:
        case AddActors():
            placed = ActorsPlaced(dict(done.value or {}), ActorStage.READY, fresh=True)
            rest = _elastic_check(state, record) if elastic else _start_added(state, record)
            return Decision((placed,)).then(rest)
        case StartActors():
            return _simple_remove(record)
        case RemoveActors() if not elastic:
            queues = tuple(c.name for c in state.channels.values() if c.kind == "shards")
            if queues:  # only once they are gone: a stopped worker can no longer take a shard back
                return _run(RequeueShards(queues, tuple(record.removed)))
            return _ended(state, record, None)
        case RequeueShards():
            return _ended(state, record, None, dict(done.value or {}))
        case RemoveActors():
            per = state.spec.role(record.role).per_group
            leaving = sorted({state.actors[n].rank // per for n in record.removed if n in state.actors})
            return _run(RemoveNodeGroups(record.role, tuple(leaving)))
        case DropActors() | RemoveNodeGroups():
            return _elastic_join(state, record)
        case FindPlacedNodes():
            placed = set(done.value or ())
            if placed != set(command.nodes):
                missing = ", ".join(str(k) for k in command.nodes if k not in placed)
                return _failed(
                    state,
                    record,
                    f"SchedulingError: node(s) {missing} of role {record.role} could not be placed in "
                    f"{command.wait_s:g}s (elastic.start_timeout_s)",
                )
            return _elastic_add(state, record)
        case CheckNodes():
            return Decision((ResizeChecked(command.ranks),)).then(_reform(state, record))
        case ReformTraining():
            if done.value is None:
                why = (
                    f"RuntimeError: training of role {record.role} did not re-form at "
                    f"{len(command.ranks)} rank(s) in {command.reform_s:g}s"
                )
                return _failed(state, record, why)
            trains = f"role {record.role} trains at world {done.value} ({len(command.ranks)} rank(s))"
            return Decision(log=(trains,)).then(_ended(state, record, None))
        case _:
            return Decision()


def _run(*commands: Command) -> Decision:
    return Decision((), commands)


def _simple_add(state: JobState, record: ResizeRecord) -> Decision:
    if not record.added:
        return _simple_remove(record)
    ranks = tuple(
        state.actors[n].rank for n in record.added if state.actors[n].stage is ActorStage.INIT
    )  # created by an earlier try: adopted, not created again
    if ranks:
        adding = AddActors(record.role, ranks, record.new_size)
        seats = growth_seats(state, (n for n in record.added if state.actors[n].stage is ActorStage.INIT))
        if seats:  # bundles a relaunch left free: taken before reserving more
            return Decision((ActorsSeated(seats),), (SetSeats(dict(seats)), adding))
        return _run(adding)
    return _start_added(state, record)


def _start_added(state: JobState, record: ResizeRecord) -> Decision:
    targets = set(start_targets(state))
    return _run(StartActors(tuple(n for n in record.added if n in targets), Purpose.RESIZE))


def _simple_remove(record: ResizeRecord) -> Decision:
    if not record.removed:
        return Decision((ResizeEnded(None),))
    return _run(RemoveActors(tuple(record.removed)))


def _elastic_join(state: JobState, record: ResizeRecord) -> Decision:
    spec = state.spec.role(record.role)
    assert spec.elastic is not None
    joining = sorted({state.actors[n].rank // spec.per_group for n in record.added})
    if joining:
        wait = spec.elastic.start_timeout_s
        return _run(FindPlacedNodes(record.role, tuple(joining), Purpose.RESIZE, wait_s=wait))
    return _elastic_check(state, record)


def _elastic_add(state: JobState, record: ResizeRecord) -> Decision:
    waiting = [state.actors[n].rank for n in record.added if state.actors[n].stage is ActorStage.INIT]
    if waiting:
        per = state.spec.role(record.role).per_group
        return _run(AddActors(record.role, tuple(waiting), (record.nodes or 0) * per))
    return _elastic_check(state, record)


def _elastic_check(state: JobState, record: ResizeRecord) -> Decision:
    spec = state.spec.role(record.role)
    assert spec.elastic is not None
    added = [state.actors[n].rank for n in record.added]
    unchecked = tuple(r for r in added if r not in record.checked)
    if unchecked:
        timeout = spec.elastic.node_check.timeout_s * 3 + 60
        return _run(CheckNodes(sub_master_name(state.job, record.role), unchecked, timeout))
    log = (f"the new node(s) of role {record.role} passed their check already",) if added else ()
    return Decision(log=log).then(_reform(state, record))


def _reform(state: JobState, record: ResizeRecord) -> Decision:
    leaving = set(record.removed)
    ranks = sorted(
        a.rank
        for n, a in state.actors.items()
        if a.role == record.role and a.rank != SUB_MASTER_RANK and n not in leaving
    )
    added = tuple(state.actors[n].rank for n in record.added)
    sub = sub_master_name(state.job, record.role)
    return _run(ReformTraining(sub, tuple(ranks), added, REFORM_TIMEOUT_S, REFORM_TIMEOUT_S + 30))


def _waits(state: JobState, record: ResizeRecord, why: str) -> Decision:
    """The SubMaster is away: the resize stays in flight; said once per resize."""
    said = any(
        e.kind == EventKind.RESIZE_WAITING and e.role == record.role and e.time >= record.started_at
        for e in state.events
    )
    if said:
        return Decision()
    message = f"resize of role {record.role} waits: {why}; it goes on once the SubMaster is set up again"
    return Decision((Note(EventKind.RESIZE_WAITING, message, record.role),))


def _failed(state: JobState, record: ResizeRecord, error: str) -> Decision:
    """A step failed: the actors it added are removed again, then the resize ends failed."""
    log = (f"resize of role {record.role} failed: {error}",)
    if record.added:
        return Decision(log=log).then(_run(RemoveActors(tuple(record.added), undo=error)))
    return Decision(log=log).then(_ended(state, record, error))


def _ended(
    state: JobState, record: ResizeRecord, error: str | None, requeued: dict[str, list[int]] | None = None
) -> Decision:
    ended = ResizeEnded(error, requeued or {})
    if record.nodes is None:
        return Decision((ended,))
    changes: tuple[ResizeEnded | Note, ...] = (ended,)
    if error is not None and record.removed and record.cause.startswith(NODE_LOST):
        # the survivors could not re-form: the failover ladder takes over (the role restarts)
        changes += (Note(EventKind.ELASTIC_REFORM_FAILED, error, record.role),)
    return Decision(changes, (ForgetLiveness(),))
