"""Elastic roles' node counts as decisions (the rules are `elastic_policy`'s, pure):

node loss (a pass):  FindLostNodes -> per role: judge_loss [-> FindPlacedNodes, judged again]
                     -> a shrink saved (`ResizeBegan`, cause "node lost"), a below-MIN notice
                     (said once per loss), or past the wait AskNodeNeeds -> FellBelowMin, stop;
                     the failures it holds are taken out of the pass, the rest go on to the
                     failover ladder (`monitor_pass`)
capacity (a turn):   per role below its target: FindPlacedNodes -> a growth saved, or the next

Each role of a pass is judged on the state the previous role's decision left (`LossJudged`
followed at once), so a shrink saved for one role makes the next one wait, as in flight.
"""

from __future__ import annotations

from dataclasses import replace

from dlu_api.vocabulary import EventKind
from dlu_prime.master.change_types import Note
from dlu_prime.master.core import monitor_pass
from dlu_prime.master.core.commands import AskNodeNeeds, FindLostNodes, FindPlacedNodes, Purpose, Wake
from dlu_prime.master.core.decision import Decision
from dlu_prime.master.core.events import Done, GrowthDue, LossJudged, PassObserved, StopRequested
from dlu_prime.master.elastic_policy import (
    GROWN,
    NODE_LOST,
    LossVerdict,
    elastic_roles,
    forgiven_by_loss,
    grow_nodes,
    judge_loss,
    missing_nodes,
    role_nodes,
)
from dlu_prime.master.lifecycle import EXIT_FAILED
from dlu_prime.master.monitor import Assessment
from dlu_prime.master.resize import FellBelowMin, ResizeBegan
from dlu_prime.master.state import JobState

# node loss -------------------------------------------------------------------------------------


def judges(state: JobState, event: PassObserved) -> bool:
    """Whether the pass has gone actors of elastic roles (their loss is judged first)."""
    return bool(event.gone_since) and bool(elastic_roles(state))


def pass_observed(state: JobState, event: PassObserved, now: float) -> Decision:
    nodes = sorted({a.node_id for n, a in state.actors.items() if n in event.gone_since and a.node_id})
    judged = LossJudged(event, frozenset(), tuple(r.name for r in elastic_roles(state)), now)
    if nodes:
        return Decision((), (FindLostNodes(tuple(n for n in nodes if n is not None), judged),))
    return Decision(follow=judged)


def lost_nodes_found(done: Done, command: FindLostNodes) -> Decision:
    if done.error is not None:
        return Decision(error=done.error)
    judged: LossJudged = command.then
    return Decision(follow=replace(judged, dead=frozenset(done.value or ())))


def placed_found(done: Done, command: FindPlacedNodes) -> Decision:
    """Ray's answer for a role below MIN: judged again with it (nothing placed on an error)."""
    judged: LossJudged = command.then
    placed = () if done.error is not None else tuple(done.value or ())
    log = (f"asking Ray for role {command.role}'s nodes failed: {done.error_text}",) if done.failed else ()
    return Decision(log=log, follow=replace(judged, placed={**judged.placed, command.role: placed}))


def loss_judged(state: JobState, event: LossJudged) -> Decision:
    """One role's loss (the first of `event.roles`), then the next; after the last, the pass's
    other failures go on to the failover ladder."""
    if not event.roles:
        result = event.observed.assessment
        kept = replace(result, failures=tuple(f for f in result.failures if f.actor not in event.held))
        rest = replace(event.observed, assessment=kept, gone_since={})
        return replace(monitor_pass.observed(rest), reply=kept)
    role, later = event.roles[0], event.roles[1:]
    mine = {
        n: t
        for n, t in event.observed.gone_since.items()
        if n in state.actors and state.actors[n].role == role
    }
    placed = event.placed.get(role)
    verdict = judge_loss(state, role, mine, event.dead, event.now, event.observed.has_extension, placed or ())
    if placed is None and verdict.below_min is not None and verdict.shrink is None:
        spec = state.spec.role(role)
        have = role_nodes(state, role)
        free = tuple(k for k in range(spec.total // spec.per_group) if k not in have)
        if free:  # below MIN: nodes Ray placed meanwhile may join in the same resize
            return Decision((), (FindPlacedNodes(role, free, Purpose.ELASTIC_LOSS, then=event),))
    if verdict.stop is not None and verdict.culprit is not None:
        forgiven = forgiven_by_loss(state, role, mine[verdict.culprit], list(mine))
        ask = AskNodeNeeds(role, verdict.culprit, verdict.below_min or verdict.stop, verdict.stop, forgiven)
        return Decision((), (ask,))
    changes: list[Note | ResizeBegan] = []
    if verdict.below_min is not None and not _said(state, role, verdict.below_min, min(mine.values())):
        changes.append(Note(EventKind.ELASTIC_BELOW_MIN, verdict.below_min, role))
    shrink = _shrink(state, role, verdict, mine, event)
    if shrink is not None:
        changes.append(shrink)
    follow = replace(event, roles=later, held=event.held | verdict.hold)
    return Decision(tuple(changes), (Wake(),) if shrink is not None else (), follow=follow)


def needs_found(done: Done, command: AskNodeNeeds) -> Decision:
    """Past the wait below MIN: the loss counted once on the lost node, then the job stops with
    what one node needs against what the cluster has free. The pass is not judged further."""
    needs = "" if done.error is not None else str(done.value or "")
    log = (
        (f"asking Ray what role {command.role}'s nodes need failed: {done.error_text}",)
        if done.failed
        else ()
    )
    reason = f"{command.stop}; {needs}" if needs else command.stop
    fell = FellBelowMin(command.role, command.culprit, command.message, command.forgiven)
    return Decision((fell,), log=log, reply=Assessment(), follow=StopRequested(EXIT_FAILED, reason))


def _shrink(
    state: JobState, role: str, verdict: LossVerdict, mine: dict[str, float], event: LossJudged
) -> ResizeBegan | None:
    plan = verdict.shrink
    if plan is None:
        return None
    spec = state.spec.role(role)
    lost = ", ".join(f"node {k}" for k in verdict.lost)
    marked = any(state.actors[n].node_id in event.dead for n in plan.removed)
    timeout = spec.elastic.replace_timeout_s if spec.elastic is not None else 0.0
    why = "Ray marked it dead" if marked else f"unplaceable for {timeout:g}s"
    joining = sorted({rank // spec.per_group for _, rank in plan.added})
    placed = f"; node(s) {', '.join(map(str, joining))} placed" if joining else ""
    first_seen = min((mine[n] for n in plan.removed if n in mine), default=event.now)
    # Only the removed ranks that were lost are the loss: a survivor the shrink removes with its
    # group (its own node alive) caused nothing, and its own crash stays counted (rule 3).
    lost_ranks = [
        n for n in plan.removed if n in mine or (n in state.actors and state.actors[n].node_id in event.dead)
    ]
    forgiven = forgiven_by_loss(state, role, first_seen, lost_ranks)
    return ResizeBegan(plan, f"{NODE_LOST}: {lost}, {why}{placed}", forgiven)


def _said(state: JobState, role: str, message: str, since: float) -> bool:
    """Whether this loss's below-MIN notice is on the timeline already (once per loss: the
    nodes lost, since its actors were first seen gone)."""
    key = message.split(" (")[0]
    return any(
        e.kind == EventKind.ELASTIC_BELOW_MIN
        and e.role == role
        and e.time >= since
        and e.message.split(" (")[0] == key
        for e in state.events
    )


# capacity --------------------------------------------------------------------------------------


def growth_due(state: JobState, event: GrowthDue, now: float) -> Decision:
    """Roles below their target, not being judged for a loss, past `resize_interval_s` since
    their last resize: Ray is asked which missing nodes it placed, one role at a time."""
    if state.resize is not None:
        return Decision()
    due: list[tuple[str, tuple[int, ...]]] = []
    for spec in elastic_roles(state):
        missing = missing_nodes(state, spec.name)
        if not missing or spec.name in event.judging:
            continue  # a role whose actors are gone: the pass decides (with what Ray placed)
        record = state.roles.get(spec.name)
        last = record.last_resize_at if record is not None else None
        assert spec.elastic is not None
        if last is not None and now - last < spec.elastic.resize_interval_s:
            continue  # not even asking Ray: at most one automatic resize per interval
        due.append((spec.name, tuple(missing)))
    return _ask(due, now)


def _ask(due: list[tuple[str, tuple[int, ...]]], now: float) -> Decision:
    if not due:
        return Decision()
    (role, missing), rest = due[0], due[1:]
    return Decision((), (FindPlacedNodes(role, missing, Purpose.GROW, then=(now, rest)),))


def grow_found(state: JobState, done: Done, command: FindPlacedNodes) -> Decision:
    now, rest = command.then
    if done.error is not None:
        log = (f"asking Ray for role {command.role}'s nodes failed: {done.error_text}",)
        return Decision(log=log).then(_ask(rest, now))
    record = state.roles.get(command.role)
    last = record.last_resize_at if record is not None else None
    plan = grow_nodes(state, command.role, list(done.value or ()), now, last)
    if plan is None:
        return _ask(rest, now)
    per = state.spec.role(command.role).per_group
    joining = sorted({rank // per for _, rank in plan.added})
    return Decision((ResizeBegan(plan, f"{GROWN}: node(s) {', '.join(map(str, joining))} placed"),))
