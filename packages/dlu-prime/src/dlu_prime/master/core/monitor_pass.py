"""A monitoring pass as decisions: record what it saw, then judge its failures (the failover
policy, with which nodes Ray marks dead) or end the job when every driver role finished."""

from __future__ import annotations

from dlu_api.vocabulary import DEATH_KINDS
from dlu_prime.extension import NodeInfo
from dlu_prime.master.change_types import FailuresCounted, NodesRemoved, Observed
from dlu_prime.master.core.commands import FindDeadNodes, RelaunchNodes, Then
from dlu_prime.master.core.decision import Decision, stopping
from dlu_prime.master.core.events import Done, PassApplied, PassObserved
from dlu_prime.master.core.failover_chain import carry_on, resume
from dlu_prime.master.failover import plan_failover
from dlu_prime.master.lifecycle import EXIT_FAILED, EXIT_OK
from dlu_prime.master.monitor import Failure
from dlu_prime.master.state import JobState


def observed(event: PassObserved) -> Decision:
    result = event.assessment
    if result.stage_changes or result.node_changes or result.failures or result.errors_seen:
        return Decision((Observed(result),), follow=PassApplied(event))
    return Decision(follow=PassApplied(event))


def applied(state: JobState, event: PassApplied) -> Decision:
    """On the state the pass left: the failures' recovery, or the end of the job."""
    result = event.observed.assessment
    if result.failures:
        nodes = {
            state.actors[f.actor].node_id or f.node_id
            for f in result.failures
            if f.kind in DEATH_KINDS and f.actor in state.actors
        }
        known = tuple(sorted(n for n in nodes if n is not None))
        if known:
            find = FindDeadNodes(known, result.failures, event.observed.gone, event.observed.has_extension)
            return Decision((), (find,))
        return judge(state, result.failures, event.observed.gone, frozenset(), event.observed.has_extension)
    if result.all_drivers_finished:
        drivers = ", ".join(r.name for r in state.spec.roles if r.is_driver)
        return stopping(state, EXIT_OK, f"every driver role finished ({drivers})")
    if state.failover is not None:  # one that waited for its SubMaster: tried again
        return resume(state)
    return Decision()


def dead_nodes_found(state: JobState, done: Done, command: FindDeadNodes) -> Decision:
    if done.error is not None:
        return Decision(error=done.error)
    dead = frozenset(done.value or ())
    return judge(state, command.failures, command.gone, dead, command.has_extension)


def judge(
    state: JobState,
    failures: tuple[Failure, ...],
    gone: frozenset[str],
    dead: frozenset[str],
    has_extension: bool,
) -> Decision:
    """deal_with_actor_restarting, then failover handling, as the pure policy decides."""
    plan = plan_failover(state, failures, has_extension=has_extension, gone=gone, dead_nodes=dead)
    log: tuple[str, ...] = ()
    if plan.ignored and not plan.acts:
        during = "a recovery" if state.failover else state.stage.value
        log = (f"ignored {len(plan.ignored)} report(s) during {during}",)
    counted = Decision((FailuresCounted(plan.node_failures, plan.notes),), log=log)
    then = Then(plan.recoveries, plan.stop)
    if plan.relaunch_nodes:
        infos = tuple(
            NodeInfo(node, actors=tuple(n for n, a in state.actors.items() if a.node_id == node))
            for node in plan.relaunch_nodes
        )
        return counted.then(Decision((NodesRemoved(plan.relaunch_nodes),), (RelaunchNodes(infos, then),)))
    if plan.stop is not None:
        return counted.then(stopping(state, EXIT_FAILED, plan.stop))
    return counted.then(carry_on(state, then))
