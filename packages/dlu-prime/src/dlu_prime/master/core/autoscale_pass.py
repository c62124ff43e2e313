"""Auto-scaling's decisions, next to failover's so the two never fight (docs/autoscaling.md).

AutoscaleObserved -> nothing during a recovery, a resize or a memory relaunch in flight (the
                     next pass asks again)
                  -> a Brain plan (cluster mode), checked against the role's min:max and the
                     sizes that failed: autoscale_decision + the resize chain's ResizeBegan,
                     or autoscale_plan_unplaceable (reported back, never retried)
                  -> a Brain memory plan: its role's actor under the most memory pressure
                     relaunched with more memory (`memory_chain`), or refused as above
                  -> else, with no Brain answering: an actor at 90% of its memory limit for
                     `measure_s` is relaunched with x1.5 (`autoscale.memory`, `memory_chain`);
                     else, once the last resize settled and its world was measured for
                     `measure_s` (counted from its first measured step), the job's own
                     policy (`dlu_prime.autoscale.policy`): its first change becomes a resize

The Brain's plans and the job's policy use the same algorithms (`dlu_prime.stats.scaling`), so
a job whose Brain goes away carries on as the Brain would have. A decision is a `dlu scale` request with the cause `autoscale` (`resize_chain.scale_requested`):
the same plan, the same checks, the same saved in-flight resize and the same steps, so the
elastic role keeps its global batch as every resize does. Pure.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace

from dlu_api.status import JobStage
from dlu_api.vocabulary import EventKind
from dlu_prime.autoscale import memory, policy
from dlu_prime.autoscale.policy import RoleView
from dlu_prime.brain_port.models import RolePlan
from dlu_prime.master.change_types import Note
from dlu_prime.master.core import memory_chain, resize_chain
from dlu_prime.master.core.decision import Decision
from dlu_prime.master.core.events import AutoscaleObserved, ScaleRequested
from dlu_prime.master.resize_plan import AUTOSCALE
from dlu_prime.master.state import JobState
from dlu_prime.stats.scaling import SizeDecision


@dataclass(frozen=True)
class Outcome:
    """What one decision came to: a resize saved in flight (`began`), the size the role has
    already, or a refusal (`error`: a plan that cannot be carried out)."""

    role: str
    old: int
    new: int
    reason: str
    began: bool = False
    plan_id: int | None = None
    error: str = ""
    memory: bool = False  # a memory relaunch: `old` and `new` are bytes, not sizes


def observed(state: JobState, event: AutoscaleObserved, now: float) -> Decision:
    settings = state.spec.autoscale
    if not settings.on or state.stage is not JobStage.RUNNING:
        return Decision()
    if state.failover is not None or state.resize is not None or state.relaunch is not None:
        return Decision()  # never during a recovery, a resize or a relaunch: decided again after it
    views = {v.role: v for v in event.views}
    if event.plans:
        plan = event.plans[0]  # one plan a pass: the next pass sees its outcome
        if plan.size is None:
            return _memory_plan(state, event, plan, now)
        return _plan(state, views, plan)
    if event.brain_up:
        return Decision()  # the Brain plans while it answers
    relaunch = memory.choose(event.memory, now, settings.measure_s, settings.settle_s)
    if relaunch is not None:
        return memory_chain.begin(state, relaunch, now)
    if event.quiet_for_s < settings.settle_s + settings.measure_s:
        return Decision()  # the last resize is measured first
    # an elastic role whose world has not yet been measured for `measure_s` (its processes were
    # still starting: a size judged on no steps read 0.0 steps/s) waits for the next pass
    measured = [v for v in event.views if not v.elastic or v.measured_s >= settings.measure_s]
    for decision in policy.choose(measured, settings):
        if decision.changes:
            return _resize(state, decision)
    return Decision()


def _memory_plan(state: JobState, event: AutoscaleObserved, plan: RolePlan, now: float) -> Decision:
    """A Brain's memory plan for a role: its actor under the most pressure now is relaunched with
    the plan's memory, or the plan is refused (reported back, so the Brain stops proposing it)."""
    found = memory.for_plan(plan, event.memory, now, state.spec.autoscale.settle_s)
    if isinstance(found, str):
        return _refused(plan, 0, found)
    began = memory_chain.begin(state, found, now)
    said = f"Brain plan #{plan.id} ({plan.algorithm}): {found.reason}"
    outcome = Outcome(plan.role, found.old, found.new, said, began=True, plan_id=plan.id, memory=True)
    return replace(began, reply=outcome)


def _plan(state: JobState, views: Mapping[str, RoleView], plan: RolePlan) -> Decision:
    """A Brain plan's size for one role."""
    view = views.get(plan.role)
    assert plan.size is not None
    said = f"Brain plan #{plan.id} ({plan.algorithm}): {plan.reason}"
    if view is None:
        return _refused(
            plan, 0, f"role {plan.role!r} is not auto-scaled (resizable, MIN:MAX or a backlog role)"
        )
    if plan.size == view.current:
        return Decision(reply=Outcome(plan.role, view.current, view.current, said, plan_id=plan.id))
    if not view.low <= plan.size <= view.high:
        return _refused(plan, view.current, f"size {plan.size} is outside {view.low}:{view.high}")
    if plan.size in view.failed:
        return _refused(plan, view.current, f"a resize of role {plan.role} to {plan.size} failed before")
    return _resize(state, SizeDecision(plan.role, view.current, plan.size, said), plan.id)


def _refused(plan: RolePlan, current: int, why: str) -> Decision:
    asked = f"{plan.role} -> {plan.size}" if plan.size is not None else f"memory {plan.memory_bytes} bytes"
    message = f"Brain plan #{plan.id} for role {plan.role} ({asked}) not carried out: {why}"
    note = Note(EventKind.AUTOSCALE_PLAN_UNPLACEABLE, message, plan.role)
    outcome = Outcome(plan.role, current, plan.size or current, plan.reason, plan_id=plan.id, error=why)
    return Decision((note,), reply=outcome)


def _resize(state: JobState, decision: SizeDecision, plan_id: int | None = None) -> Decision:
    role, old, new = decision.role, decision.current, decision.target
    scaled = resize_chain.scale_requested(state, ScaleRequested(role, new, cause=AUTOSCALE))
    if scaled.error is not None:
        why = str(scaled.error)
        log = (f"autoscale {decision.reason}: refused: {why}",)
        if plan_id is None:
            return Decision(log=log, reply=Outcome(role, old, new, decision.reason, error=why))
        note = Note(EventKind.AUTOSCALE_PLAN_UNPLACEABLE, f"{decision.reason}: refused: {why}", role)
        return Decision(
            (note,), log=log, reply=Outcome(role, old, new, decision.reason, plan_id=plan_id, error=why)
        )
    note = Note(EventKind.AUTOSCALE_DECISION, decision.reason, role)
    outcome = Outcome(role, old, new, decision.reason, began=bool(scaled.changes), plan_id=plan_id)
    return Decision((note, *scaled.changes), scaled.commands, outcome, log=(f"autoscale: {decision.reason}",))
