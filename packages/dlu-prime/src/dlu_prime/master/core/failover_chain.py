"""A recovery of the failover ladder as a chain of decisions, one per step's outcome.

role (tier 2):       SubMasterFailover | ReplaceActors -> StartActors
SubMaster (tier 5):  ReplaceActors -> RecoverSubMasters
job (tier 3):        INIT, ForgetLiveness + ReplaceActors -> RunChecks -> READY, RUNNING, StartActors
node (tier 4):       NodesRemoved, RelaunchNodes -> NodesRelaunched, then the pass's recoveries

The recovery in flight is saved (`state.failover`) before its first step, so a PrimeMaster
rebuilt half way starts its steps again (`resume`) without counting it twice. A step that fails
ends the record (`FailoverEnded` with the error) and escalates by the tier table: a role or
SubMaster recovery becomes a job-level restart, a failed job restart stops the job.
"""

from __future__ import annotations

from dlu_api.status import JobStage
from dlu_api.vocabulary import ActorStage, FailureKind, Tier
from dlu_prime.master.change_types import (
    ActorsPlaced,
    FailoverBegan,
    FailoverEnded,
    NodesRelaunched,
    Observed,
    StageChanged,
)
from dlu_prime.master.core.commands import (
    ForgetLiveness,
    Purpose,
    RecoverSubMasters,
    RelaunchNodes,
    ReplaceActors,
    ReplacedSeen,
    RunChecks,
    SeeReplaced,
    StartActors,
    SubMasterFailover,
    Then,
    Wake,
)
from dlu_prime.master.core.decision import Decision, stage_change, stopping
from dlu_prime.master.core.events import CarryOn, Done, PassApplied, PassObserved, RecoveryFailed
from dlu_prime.master.core.setup_retry import retry_setup
from dlu_prime.master.failover import Recovery, job_restart
from dlu_prime.master.lifecycle import EXIT_FAILED, gone, start_targets
from dlu_prime.master.monitor import Assessment, Failure, assess
from dlu_prime.master.resize_plan import SubMasterAway
from dlu_prime.master.state import SUB_MASTER_RANK, FailoverRecord, JobState
from dlu_prime.master.tiers import escalation


def begin(state: JobState, recovery: Recovery, then: Then, escalated: bool = False) -> Decision:
    """Count and save the recovery in flight, then its first step. A role or SubMaster failover
    still in flight for the same role (one waiting for its dead SubMaster, or a saved one whose
    replacement died before a rebuilt PrimeMaster resumed it) is taken into the new recovery:
    one action recovers both, each fault counted once on its own culprit; the SubMaster tier
    if either is one (its SubMaster is replaced and set up, then the ranks started)."""
    waiting = state.failover
    widens: tuple[str, ...] = ()
    tier = recovery.tier
    ladder = (Tier.ROLE, Tier.SUB_MASTER)
    if waiting is not None and waiting.tier in ladder and tier in ladder and waiting.role == recovery.role:
        widens = tuple(n for n in waiting.actors if n not in recovery.actors)
        if widens and waiting.tier is Tier.SUB_MASTER:
            tier = Tier.SUB_MASTER
    actors = (*recovery.actors, *widens)
    first = _first_step(state, tier, recovery.role, actors, recovery.reason, then)
    return Decision((FailoverBegan(recovery, escalated, widens, tier),)).then(first)


def resume(state: JobState) -> Decision:
    """The saved recovery in flight, from its first step (every step is idempotent)."""
    record = state.failover
    if record is None or state.stage is not JobStage.RUNNING:
        return Decision()
    return _first_step(state, record.tier, record.role, tuple(record.actors), record.reason, Then())


def resume_saved(state: JobState) -> Decision:
    """A rebuilt PrimeMaster's saved recovery in flight. Its actors are looked at first
    (`SeeReplaced`): replacing one again from the first step would absorb, uncounted, a death it
    met in between (a placed replacement's node lost, an actor not replaced yet killed)."""
    record = state.failover
    if record is None or state.stage is not JobStage.RUNNING:
        return Decision()
    actors = state.actors
    if record.tier is Tier.JOB:
        names = tuple(n for n in record.actors if n in actors)
        return Decision((), (SeeReplaced(names),)) if names else resume(state)
    if record.tier not in (Tier.ROLE, Tier.SUB_MASTER):
        return resume(state)
    unreplaced = [n for n in record.actors if n in actors and actors[n].stage is ActorStage.INIT]
    placed = [n for n in record.actors if n in actors and actors[n].stage is not ActorStage.INIT]
    if placed or unreplaced:  # else nothing to look at: the failover is all still to do
        nodes = sorted({node for n in unreplaced if (node := actors[n].node_id) is not None})
        return Decision((), (SeeReplaced((*placed, *unreplaced), tuple(nodes)),))
    return resume(state)


def replaced_seen(state: JobState, done: Done, now: float) -> Decision:
    """The saved failover's actors as the rebuilt PrimeMaster found them. A job-level restart
    saved in RUNNING has only its start left (`_job_restart_left`). Otherwise, all alive: the
    failover goes on from its first step; one that failed since is judged as a pass judges a
    failure (its event, its count on its culprit and node, the limits), and its recovery takes
    the saved failover's other actors along (`begin`): a placed replacement that failed, or an
    actor not replaced yet that died of a fault of its own (`_unreplaced_deaths`)."""
    seen = done.value
    record = state.failover
    if record is None or state.stage is not JobStage.RUNNING:
        return Decision()
    if done.error is not None or not isinstance(seen, ReplacedSeen):
        return resume(state)  # no view: as before, the failover replaces them all
    if record.tier is Tier.JOB:
        return _job_restart_left(state, seen, now)
    actors = state.actors
    placed = {
        n: o for n, o in seen.observations.items() if n in actors and actors[n].stage is not ActorStage.INIT
    }
    judged = assess(state, placed, now)
    failures = (*judged.failures, *_unreplaced_deaths(state, seen), *_unsaved_replacement_deaths(state, seen))
    if not failures:
        return resume(state)
    found = Assessment(failures=failures, errors_seen=judged.errors_seen)
    lost = frozenset(n for n, o in seen.observations.items() if gone(o) or o.unavailable)
    observed = PassObserved(found, lost, seen.has_extension)
    return Decision((Observed(found),), follow=PassApplied(observed))


def _unreplaced_deaths(state: JobState, seen: ReplacedSeen) -> list[Failure]:
    """Faults of their own of the actors the saved failover has yet to replace (seed 17404):
    deaths the dead predecessor cannot have caused, of actors alive when it began (`alive`: the
    fault a mark, an error, a hang; one it began for because it died is not judged again, seed
    194: Ray's rebuild of it is that death). The failover's restart kills an actor for good, so
    one Ray reconstructed died on its own; one gone did so if Ray marks its node dead (else the
    dead PrimeMaster may have killed it half way through its restart: the failover's)."""
    record = state.failover
    out: list[Failure] = []
    for name in record.alive if record is not None else ():
        actor, observed = state.actors.get(name), seen.observations.get(name)
        if actor is None or observed is None or actor.stage is not ActorStage.INIT or observed.unavailable:
            continue
        node = actor.node_id or observed.node_id
        if observed.reconstructed and observed.stage is ActorStage.INIT:
            why = "actor process died before its failover replaced it; Ray reconstructed it"
            out.append(Failure(name, actor.role, FailureKind.RESTARTED, why, node, unreplaced=True))
        elif observed.stage is None and node in seen.dead_nodes and not _left_to_the_pass(state, node):
            why = f"{observed.error or 'actor died'} (before its failover replaced it)"
            out.append(Failure(name, actor.role, FailureKind.DIED, why, node, unreplaced=True))
    return out


def _unsaved_replacement_deaths(state: JobState, seen: ReplacedSeen) -> list[Failure]:
    """Losses with a node of actors the saved failover has yet to replace, which the dead
    predecessor may have placed again without saving it. Gone for good from a node Ray marks
    dead, an actor is lost with that node, a fault of its own, counted on it and the node:
    - one the failover began for because Ray rebuilt it (`rebuilt`, seed 57311): its rebuilt
      process, or a replacement of it, ran on a live node until that node was lost;
    - one it began for because it died (seed 22974): only gone from another node than the one
      saved, where only a replacement ran that name. Gone where it died is the death it began
      for (one never replaced, or replaced on the same node: not told apart, so not counted
      twice)."""
    record = state.failover
    if record is None:
        return []
    out: list[Failure] = []
    for name in record.actors:
        actor, observed = state.actors.get(name), seen.observations.get(name)
        if name in record.alive or actor is None or observed is None or actor.stage is not ActorStage.INIT:
            continue
        ran_on = observed.node_id or (actor.node_id if name in record.rebuilt else None)
        told_apart = name in record.rebuilt or ran_on != actor.node_id
        gone_for_good = observed.stage is None and not observed.unavailable
        lost = ran_on is not None and ran_on in seen.dead_nodes and not _left_to_the_pass(state, ran_on)
        if gone_for_good and told_apart and lost:
            why = f"lost with node {ran_on} before its failover replaced it (the failover was resumed)"
            out.append(Failure(name, actor.role, FailureKind.DIED, why, ran_on, unreplaced=True))
    return out


def _left_to_the_pass(state: JobState, node: str | None) -> bool:
    """Whether an actor outside the saved failover sat on the lost `node` (seed 7395): the next
    pass finds it gone with the node and judges the loss as any pass does (the elastic
    shrink, a SubMaster's recovery, one count on the node), while the failover's own actor,
    held by it, is taken along. Judged here as well, the one loss would be counted twice."""
    record = state.failover
    saved = set(record.actors) if record is not None else set[str]()
    return any(
        a.node_id == node and n not in saved and not a.stage.is_terminal for n, a in state.actors.items()
    )


def _job_restart_left(state: JobState, seen: ReplacedSeen, now: float) -> Decision:
    """A job-level restart saved in RUNNING (seed 17842): its actors were replaced and passed
    their checks (READY -> RUNNING is saved with its last step), so only their start is left,
    which a rebuilt PrimeMaster leaves to the failover (`unstarted`). Replacing every actor
    again would absorb, uncounted, a death since (a replacement's node lost): the live ones
    are started and the restart ends; the dead are the next pass's to judge, as any death."""
    dead = {f.actor for f in assess(state, seen.observations, now).failures}
    targets = tuple(n for n in start_targets(state) if n not in dead)
    return Decision((), (StartActors(targets, Purpose.FAILOVER, Then()),))


def carry_on(state: JobState, then: Then) -> Decision:
    """After a step ended well: stop as the chain must, or begin the pass's next recovery. One
    of the role of a failover still in flight goes first, so that `begin` takes it along (a
    recovery of another role begun first would end it unfinished)."""
    if then.stop is not None:
        return stopping(state, EXIT_FAILED, then.stop)
    if not then.recoveries or state.stage is not JobStage.RUNNING:
        return Decision()
    waiting = state.failover
    ordered = sorted(then.recoveries, key=lambda r: waiting is not None and r.role != waiting.role)
    first, *rest = ordered
    return begin(state, first, Then(tuple(rest)))


def _first_step(
    state: JobState, tier: Tier, role: str | None, actors: tuple[str, ...], reason: str, then: Then
) -> Decision:
    if tier is Tier.JOB:
        changes = (
            (stage_change(state, JobStage.INIT, f"job-level restart: {reason}"),)
            if state.stage is JobStage.RUNNING
            else ()
        )
        return Decision(changes, (ForgetLiveness(), ReplaceActors(actors, Purpose.FAILOVER, then)))
    if tier is Tier.SUB_MASTER:
        return Decision((), (ReplaceActors(actors, Purpose.FAILOVER, then),))
    sub = [n for n, a in state.actors.items() if a.role == role and a.rank == SUB_MASTER_RANK]
    if sub:
        return Decision((), (SubMasterFailover(sub[0], actors, reason, then),))
    return Decision((), (ReplaceActors(actors, Purpose.FAILOVER, then),))


def after(state: JobState, done: Done) -> Decision:
    """The outcome of one step of the recovery in flight (or of a node relaunch)."""
    command = done.command
    if isinstance(command, RelaunchNodes):
        return _relaunched(state, done, command)
    record = state.failover
    if record is None:
        return Decision()
    then: Then = getattr(command, "then", Then())
    if isinstance(command, RunChecks) and done.error is not None:
        retry = retry_setup(state, done, command)
        if retry is not None and retry.error is None:
            return retry
        if retry is not None and retry.error is not None:
            return _ended(record, f"{type(retry.error).__name__}: {retry.error}", then)
    if isinstance(command, SubMasterFailover) and isinstance(done.error, SubMasterAway):
        # Its SubMaster died (with a node, or on its own): not this failover's failure. It waits,
        # saved in flight; the pass judges the SubMaster's death, and its recovery takes this
        # one's ranks with it (`begin`).
        return Decision(
            (), (Wake(),), log=(f"{record.tier.value} failover of {record.role} waits: {done.error}",)
        )
    if done.error is not None:
        return _ended(record, done.error_text, then)
    match command:
        case ReplaceActors():
            placed = ActorsPlaced(dict(done.value or {}), ActorStage.READY, fresh=True)
            if record.tier is Tier.JOB:
                wait = state.spec.health.heartbeat_timeout_s
                return Decision((placed,), (RunChecks((), Purpose.FAILOVER, then=then, wait_s=wait),))
            if record.tier is Tier.SUB_MASTER:
                subs = tuple(n for n in command.names if state.actors[n].rank == SUB_MASTER_RANK)
                return Decision((placed,), (RecoverSubMasters(subs, then),))
            return Decision((placed,), (StartActors(command.names, Purpose.FAILOVER, then),))
        case RunChecks():
            ready = stage_change(state, JobStage.READY, "every actor restarted and passed its self check")
            running = StageChanged(JobStage.RUNNING, "job started")  # READY -> RUNNING, as applied
            return Decision(
                (ready, running), (StartActors(tuple(start_targets(state)), Purpose.FAILOVER, then),)
            )
        case RecoverSubMasters():
            ranks = tuple(n for n in record.actors if state.actors[n].rank != SUB_MASTER_RANK)
            if ranks:  # a role failover it took with it: its replaced ranks start now
                return Decision((), (StartActors(ranks, Purpose.FAILOVER, then),))
            return _ended(record, None, then)
        case _:
            return _ended(record, None, then)


def _ended(record: FailoverRecord, error: str | None, then: Then) -> Decision:
    follow = CarryOn(then) if error is None else RecoveryFailed(record, error, then)
    return Decision((FailoverEnded(record, error),), follow=follow)


def escalate(state: JobState, failed: RecoveryFailed) -> Decision:
    """A failed recovery (already recorded ended): a job-level restart of the same fault
    (`failover_escalated`, not another fault) where the tier table allows one, else the stop."""
    record, error = failed.record, failed.error
    if state.stage in (JobStage.STOPPING, JobStage.STOPPED):
        return Decision()
    if escalation(record.tier) is None or state.stage is not JobStage.RUNNING:
        return stopping(
            state, EXIT_FAILED, f"job-level failover failed: {error}; first failure: {record.reason}"
        )
    first = Failure(record.culprit or record.actors[0], record.role or "", FailureKind.FAILOVER_FAILED, error)
    recoveries, stop = job_restart(state, first, [record.role] if record.role else [])
    if stop is not None:
        return stopping(state, EXIT_FAILED, stop)
    return begin(state, recoveries[0], failed.then, escalated=True)


def _relaunched(state: JobState, done: Done, command: RelaunchNodes) -> Decision:
    nodes = tuple(info.node_id for info in command.nodes)
    if done.error is not None:
        names = ", ".join(n[:12] for n in nodes)
        return stopping(state, EXIT_FAILED, f"node relaunch of {names} failed: {done.error_text}")
    replaced = [info.node_id for info in done.value or ()]
    change = NodesRelaunched(nodes, replaced, done.duration_s)
    return Decision((change,), follow=CarryOn(command.then))
