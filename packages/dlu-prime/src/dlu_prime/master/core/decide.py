"""The one decision function: `decide(state, event, now) -> Decision`.

Every decision of the PrimeManager is made here, from the recorded state and one event: the
tier of a failure and its escalation, whether an effect joins a fault in flight, setup
retries, an elastic node loss, growth and resize (`dlu scale`), auto-scaling (`autoscale_pass`),
the stall notice, a memory relaunch (`memory_chain`), limits, stop conditions. It calls the pure policies (`failover`, `monitor`,
`tiers`, `elastic_policy`, `resize`, `stall`, `autoscale.policy`) and returns the changes to
save and the commands to run; it does no I/O, takes no lock and never changes `state` (the
PrimeManager applies the changes).
"""

from __future__ import annotations

from dlu_api.status import JobStage
from dlu_prime.master.core import (
    autoscale_pass,
    elastic_chain,
    failover_chain,
    memory_chain,
    monitor_pass,
    requests,
    resize_chain,
    stages,
    stall_notice,
)
from dlu_prime.master.core.commands import (
    AddActors,
    AdoptResized,
    AskNodeNeeds,
    CheckNodes,
    Cleanup,
    DropActors,
    FindDeadNodes,
    FindDeadPeers,
    FindLostNodes,
    FindPlacedNodes,
    KnowActors,
    PlaceActors,
    Purpose,
    ReformTraining,
    RelaunchNodes,
    RemoveActors,
    RemoveNodeGroups,
    ReplaceActors,
    RequeueShards,
    RunChecks,
    SeeReplaced,
    StartActors,
    StopActors,
)
from dlu_prime.master.core.decision import Decision, stopping
from dlu_prime.master.core.events import (
    AutoscaleObserved,
    CarryOn,
    Done,
    Event,
    GrowthDue,
    InPlaceReported,
    LossJudged,
    MasterRebuilt,
    PassApplied,
    PassObserved,
    PrepareRequested,
    RecoveryFailed,
    ResizeDue,
    RestartRequested,
    ScaleRequested,
    StallObserved,
    StartRequested,
    StopRequested,
    Tick,
)
from dlu_prime.master.state import JobState


def decide(state: JobState, event: Event, now: float) -> Decision:
    """What follows from `event` in `state` at time `now` (see the module docstring)."""
    match event:
        case PassObserved() if elastic_chain.judges(state, event):
            return elastic_chain.pass_observed(state, event, now)
        case PassObserved():
            return monitor_pass.observed(event)
        case LossJudged():
            return elastic_chain.loss_judged(state, event)
        case ScaleRequested():
            return resize_chain.scale_requested(state, event)
        case ResizeDue():
            return resize_chain.resume(state)
        case GrowthDue():
            return elastic_chain.growth_due(state, event, now)
        case StallObserved():
            return stall_notice.stall_observed(state, event, now)
        case AutoscaleObserved():
            return autoscale_pass.observed(state, event, now)
        case PassApplied():
            return monitor_pass.applied(state, event)
        case InPlaceReported():
            return requests.inplace_reported(state, event)
        case RestartRequested():
            return requests.restart_requested(state, event)
        case StopRequested(exit_code=code, reason=reason):
            return stopping(state, code, reason)
        case PrepareRequested():
            return stages.prepare(state)
        case StartRequested(stop=stop):
            return stages.start(state, stop)
        case MasterRebuilt():
            return stages.master_rebuilt(state)
        case Tick():
            return _tick(state)
        case RecoveryFailed():
            return failover_chain.escalate(state, event)
        case CarryOn(then=then):
            return failover_chain.carry_on(state, then)
        case Done(command=SeeReplaced()):
            return failover_chain.replaced_seen(state, event, now)
        case Done():
            return _done(state, event)


def _tick(state: JobState) -> Decision:
    if state.stage is JobStage.STOPPING:
        return stages.finish_stopping(state)
    return failover_chain.resume_saved(state)


def _done(state: JobState, done: Done) -> Decision:
    command = done.command
    match command:
        case PlaceActors():
            return stages.placed(state, done)
        case RunChecks(purpose=Purpose.PREPARE):
            return stages.checked(state, done, command)
        case FindDeadNodes():
            return monitor_pass.dead_nodes_found(state, done, command)
        case FindDeadPeers():
            return requests.inplace_judged(state, done, command)
        case ReplaceActors(purpose=Purpose.RESTART_REQUEST):
            return requests.replaced(done)
        case StopActors() | Cleanup():
            return stages.stop_step(state, done)
        case AdoptResized() | StartActors(purpose=Purpose.SELF_RECOVER):
            return stages.self_recover_failed(state, done)
        case StartActors(purpose=Purpose.START):
            return Decision(error=done.error)
        case RelaunchNodes():
            return failover_chain.after(state, done)
        case FindLostNodes():
            return elastic_chain.lost_nodes_found(done, command)
        case AskNodeNeeds():
            return elastic_chain.needs_found(done, command)
        case FindPlacedNodes(purpose=Purpose.ELASTIC_LOSS):
            return elastic_chain.placed_found(done, command)
        case FindPlacedNodes(purpose=Purpose.GROW):
            return elastic_chain.grow_found(state, done, command)
        case (
            KnowActors()
            | AddActors()
            | RemoveActors()
            | DropActors()
            | RemoveNodeGroups()
            | RequeueShards()
            | FindPlacedNodes()
            | CheckNodes()
            | ReformTraining()
            | StartActors(purpose=Purpose.RESIZE)
        ):
            return resize_chain.after(state, done)
        case _ if getattr(command, "purpose", None) is Purpose.MEMORY:
            return memory_chain.after(state, done)
        case _ if getattr(command, "purpose", None) is Purpose.FAILOVER:
            return failover_chain.after(state, done)
        case _:
            return Decision(error=done.error)
