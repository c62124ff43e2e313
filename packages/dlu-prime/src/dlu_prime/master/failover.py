"""The failover policy: from the failures of one monitoring pass to a recovery plan.

Pure, like the monitoring policy: it reads the state and returns what to do; the PrimeManager
counts, saves and acts. The steps follow the failover seed's `deal_with_actor_restarting`:
a failure on a node that was relaunched resets that node's count and is not a failure;
any other failure is counted against its node; a node over its limit is relaunched; then
failover handling picks a tier per the roles' recovery policies, or stops the job at a limit.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass, field, replace

from dlu_api.spec.models import RecoveryPolicy
from dlu_api.status import JobStage
from dlu_api.vocabulary import DEATH_KINDS, ActorStage, FailureKind, InPlaceDecision, InPlaceVerdict, Tier
from dlu_prime.master.causality import FaultInFlight, Report, effect_of
from dlu_prime.master.elastic_policy import NODE_LOST as LOSS_CAUSE
from dlu_prime.master.monitor import Failure
from dlu_prime.master.state import SUB_MASTER_RANK, JobState
from dlu_prime.master.tiers import Budget, limit_reached, over_limit
from dlu_prime.roles import recovery_policy


@dataclass(frozen=True)
class Recovery:
    """One recovery to run: restart `actors` at `tier` (for `role`, unless job-wide)."""

    tier: Tier
    actors: tuple[str, ...]
    reason: str
    role: str | None = None
    culprit: str | None = None  # the actor whose failure caused it (the root cause, for the timeline)
    node_id: str | None = None  # the culprit's node
    joined: bool = False  # only actors lost with another role's failed node: that fault's, not counted
    alive: tuple[str, ...] = ()  # of `actors`, those alive as it began (marked, hung): `FailoverRecord.alive`
    rebuilt: tuple[str, ...] = ()  # of `actors`, those Ray rebuilt as it began: `FailoverRecord.rebuilt`


@dataclass(frozen=True)
class FailoverPlan:
    """What one pass of failures leads to. `stop` set means the job ends with that reason."""

    node_failures: dict[str, int] = field(default_factory=dict[str, int])
    relaunch_nodes: tuple[str, ...] = ()
    recoveries: tuple[Recovery, ...] = ()
    stop: str | None = None
    ignored: tuple[Failure, ...] = ()
    counted: tuple[Failure, ...] = ()
    notes: tuple[str, ...] = ()

    @property
    def acts(self) -> bool:
        return bool(self.recoveries or self.stop or self.relaunch_nodes)


def with_traceback(reason: str, failure: Failure) -> str:
    """A stop reason: one line naming the limit and culprit, then the culprit's full error."""
    detail = failure.message.strip()
    return f"{reason}\n{detail}" if "\n" in detail else reason


def culprit(failure: Failure) -> str:
    """'actor on node N: last line of the error', for reasons and the timeline."""
    lines = [line for line in failure.message.strip().splitlines() if line.strip()]
    where = f" on node {failure.node_id[:12]}" if failure.node_id else ""
    return f"{failure.actor}{where} ({failure.kind}): {lines[-1] if lines else failure.kind}"


NODE_LOST = FailureKind.NODE_LOST


def node_mates(
    state: JobState, failures: Sequence[Failure], gone: Collection[str], dead_nodes: Collection[str]
) -> list[Failure]:
    """The other actors lost with a dead actor's node, as failures of that one fault.

    Ray reports the actors of a lost node one at a time, often in different monitoring passes:
    taken one by one they would make one recovery (and one count) per actor. The actors on the
    node of a dead actor that are gone too, or all of them once Ray marks the node dead, join
    the dead actor's recovery instead.
    """
    reported = {f.actor for f in failures}
    out: list[Failure] = []
    for failure in failures:
        if failure.kind not in DEATH_KINDS:
            continue
        record = state.actors.get(failure.actor)
        node = (record.node_id if record is not None else None) or failure.node_id
        if node is None:
            continue
        for name, mate in state.actors.items():
            if name in reported or mate.node_id != node or mate.stage.is_terminal:
                continue
            if node in dead_nodes or name in gone:
                why = "Ray marked the node dead" if node in dead_nodes else "gone at the same time"
                message = f"lost with node {node[:12]} ({why}), where {failure.actor} died"
                out.append(Failure(name, mate.role, NODE_LOST, message, node))
                reported.add(name)
    return out


def one_death_per_node(state: JobState, failures: Sequence[Failure]) -> list[Failure]:
    """Actors of one node found dead in the same pass died of one fault (the node, or what
    killed its processes at once): the first is its culprit, the others join it."""
    roots: dict[str, str] = {}
    out: list[Failure] = []
    for failure in failures:
        record = state.actors.get(failure.actor)
        node = (record.node_id if record is not None else None) or failure.node_id
        if failure.kind in DEATH_KINDS and node is not None:
            root = roots.setdefault(node, failure.actor)
            if root != failure.actor:
                failure = replace(
                    failure,
                    kind=NODE_LOST,
                    message=f"died with {root} on node {node[:12]}: {failure.message}",
                )
        out.append(failure)
    return out


def _first_per_actor(failures: Sequence[Failure]) -> list[Failure]:
    """Two reports of one failure (a death and an error report, a push and a poll) are one."""
    seen: set[str] = set()
    out: list[Failure] = []
    for failure in failures:
        if failure.actor not in seen:
            seen.add(failure.actor)
            out.append(failure)
    return out


def _to_replace(state: JobState) -> set[str]:
    """The actors the failover in flight has yet to replace (saved INIT when it began): their
    failures are its fault's. One it already replaced (placed, or started) that fails again is
    a new fault (seed 8553: the node of a replacement lost before a rebuilt PrimeMaster resumed)."""
    record = state.failover
    if record is None:
        return set[str]()
    actors = state.actors
    return {n for n in record.actors if n not in actors or actors[n].stage is ActorStage.INIT}


def plan_failover(
    state: JobState,
    failures: Sequence[Failure],
    *,
    has_extension: bool,
    gone: Collection[str] = (),
    dead_nodes: Collection[str] = (),
) -> FailoverPlan:
    """Decide the recovery for this pass's failures (see the module docstring). `gone`: actors
    seen dead or restarting in this pass; `dead_nodes`: nodes Ray marks dead (see `node_mates`)."""
    if state.stage is not JobStage.RUNNING:
        # The seed: reports during non-RUNNING stages are ignored; a restart is under way.
        return FailoverPlan(ignored=tuple(failures))
    in_flight = _to_replace(state)
    if state.resize is not None:  # being created or stopped by a resize: that resize's
        in_flight |= {*state.resize.added, *state.resize.removed}
    held = in_flight - {f.actor for f in failures if f.unreplaced}  # a fault of its own (seed 17404)
    ignored = [f for f in failures if f.actor in held]
    current = one_death_per_node(state, _first_per_actor([f for f in failures if f.actor not in held]))
    if not current:
        return FailoverPlan(ignored=tuple(ignored))
    current += [f for f in node_mates(state, current, gone, dead_nodes) if f.actor not in held]

    spec = state.spec
    limits = spec.limits
    node_failures = dict(state.node_failures)
    relaunch: list[str] = []
    notes: list[str] = []
    counted: list[Failure] = []
    affected: dict[str, Failure] = {}
    for failure in current:
        record = state.actors[failure.actor]
        node = record.node_id or failure.node_id
        affected[failure.actor] = failure
        if failure.kind == NODE_LOST:
            continue  # the fault of the dead actor it went with, counted there
        if node is None:
            counted.append(failure)
            continue
        if node in state.removed_nodes:
            node_failures[node] = 0  # caused by our relaunch of that node: not a failure
            continue
        counted.append(failure)
        node_failures[node] = node_failures.get(node, 0) + 1
        limit = spec.role(record.role).per_node_max_failure
        if node_failures[node] > limit and node not in relaunch:
            if has_extension:
                relaunch.append(node)
            else:
                notes.append(
                    f"node {node[:12]} failed {node_failures[node]} times (per_node_max_failure={limit}); "
                    "no extension is configured to relaunch it"
                )
    first = current[0]
    if relaunch:
        if over_limit(state, Budget.NODE, adding=len(relaunch)):
            return FailoverPlan(
                node_failures=node_failures,
                stop=with_traceback(
                    f"node_max_restart={limits.node_max_restart} reached relaunching "
                    f"{', '.join(n[:12] for n in relaunch)}; first failure: {culprit(first)}",
                    first,
                ),
                ignored=tuple(ignored),
                counted=tuple(counted),
            )
        for name, record in state.actors.items():  # everything on a relaunched node restarts
            if record.node_id in relaunch and name not in affected:
                affected[name] = Failure(
                    name, record.role, FailureKind.NODE_RELAUNCH, "node relaunched", record.node_id
                )

    recoveries, stop = _handle(state, affected, first, frozenset(dead_nodes))
    return FailoverPlan(
        node_failures=node_failures,
        relaunch_nodes=tuple(relaunch),
        recoveries=recoveries,
        stop=with_traceback(stop, first) if stop is not None else None,
        ignored=tuple(ignored),
        counted=tuple(counted),
        notes=tuple(notes),
    )


def _handle(
    state: JobState, affected: dict[str, Failure], first: Failure, dead_nodes: frozenset[str]
) -> tuple[tuple[Recovery, ...], str | None]:
    """Failover handling: one job-level restart, or one recovery per role (SubMaster first)."""
    spec = state.spec
    roles = sorted(
        {state.actors[name].role for name in affected}, key=lambda r: [x.name for x in spec.roles].index(r)
    )
    go_global = [
        role
        for role in roles
        if recovery_policy(spec.role(role)) is RecoveryPolicy.GLOBAL
        or state.roles[role].escalation_count >= spec.role(role).escalate_after
    ]
    if go_global:
        return job_restart(state, first, go_global)

    def _alive(names: Sequence[str]) -> tuple[str, ...]:
        return tuple(n for n in names if affected[n].kind not in DEATH_KINDS)

    def _rebuilt(names: Sequence[str]) -> tuple[str, ...]:
        return tuple(n for n in names if affected[n].kind is FailureKind.RESTARTED)

    recoveries: list[Recovery] = []
    for role in roles:
        role_spec = spec.role(role)
        names = [n for n in affected if state.actors[n].role == role]
        sub = [n for n in names if state.actors[n].rank == SUB_MASTER_RANK]
        workers = [n for n in names if state.actors[n].rank != SUB_MASTER_RANK]
        culprit_failure = affected[names[0]]
        if all(affected[n].kind == NODE_LOST for n in names):
            # Lost with another role's node: that fault's recovery, not one of this role's own.
            root = next(f for f in affected.values() if f.kind != NODE_LOST)
            tiers = ((Tier.SUB_MASTER, sub), (Tier.ROLE, sorted(workers, key=lambda n: state.actors[n].rank)))
            why = f"lost with node {(root.node_id or '?')[:12]}: {culprit(root)}"
            recoveries += [
                Recovery(tier, tuple(group), why, role, root.actor, root.node_id, joined=True)
                for tier, group in tiers
                if group
            ]
            continue
        if sub and lost_with_node(state, sub[0], dead_nodes):
            # Died with the node an elastic resize in flight is shrinking away: that loss's effect.
            cause = affected[sub[0]]
            why = f"{culprit(cause)} (lost with its node, which the resize in flight removes)"
            recoveries.append(
                Recovery(Tier.SUB_MASTER, tuple(sub), why, role, cause.actor, cause.node_id, joined=True)
            )
        elif sub:
            if over_limit(state, Budget.SUB_MASTER, role):
                return (), (
                    f"role {role} reached max_restart={role_spec.max_restart} restarting its SubMaster; "
                    f"culprit: {culprit(culprit_failure)}"
                )
            cause = affected[sub[0]]
            recoveries.append(
                Recovery(
                    Tier.SUB_MASTER,
                    tuple(sub),
                    culprit(cause),
                    role,
                    cause.actor,
                    cause.node_id,
                    alive=_alive(sub),
                    rebuilt=_rebuilt(sub),
                )
            )
        if workers and sub and all(affected[n].kind == NODE_LOST for n in workers):
            # Lost with the node its own SubMaster died with (seed 16919): that death's
            # recovery, counted on the SubMaster once, not a second failover of the role.
            root = affected[sub[0]]
            why = f"lost with node {(root.node_id or '?')[:12]}: {culprit(root)}"
            ordered = tuple(sorted(workers, key=lambda n: state.actors[n].rank))
            recoveries.append(Recovery(Tier.ROLE, ordered, why, role, root.actor, root.node_id, joined=True))
        elif workers:
            over = role_limit_reached(state, role)
            if over is not None:
                return (), f"{over}; culprit: {culprit(affected[workers[0]])}"
            ordered = sorted(workers, key=lambda n: state.actors[n].rank)
            cause = affected[workers[0]]
            recoveries.append(
                Recovery(
                    Tier.ROLE,
                    tuple(ordered),
                    culprit(cause),
                    role,
                    cause.actor,
                    cause.node_id,
                    alive=_alive(ordered),
                    rebuilt=_rebuilt(ordered),
                )
            )
    return tuple(recoveries), None


def lost_with_node(state: JobState, actor: str, dead_nodes: Collection[str]) -> bool:
    """Whether `actor` died with a node that the elastic resize in flight removes as lost (so
    its death is that loss's effect, not a fault of its own). By cause: its node is one Ray
    marks dead. Sharing a node with the removed ranks is not enough: a SubMaster killed on its
    own later, on the node a job restart put it with them, is a fault of its own."""
    record = state.resize
    if record is None or not record.cause.startswith(LOSS_CAUSE):
        return False
    node = state.actors[actor].node_id
    return (
        node is not None
        and node in dead_nodes
        and any(state.actors[n].node_id == node for n in record.removed if n in state.actors)
    )


def role_limit_reached(state: JobState, role: str) -> str | None:
    """The one check of a role's restart budget (role failovers, and restarts a SubMaster asks
    for): the limit it would exceed, or None."""
    return limit_reached(state, Budget.ROLE, role)


def job_restart(
    state: JobState, first: Failure, because: Sequence[str] = ()
) -> tuple[tuple[Recovery, ...], str | None]:
    """Tier 3: every actor restarts, within the job and global-restart budgets."""
    limits = state.spec.limits
    if over_limit(state, Budget.GLOBAL):
        return (), (
            f"global_restart_budget={limits.global_restart_budget} used up "
            f"({state.global_restart_count} job-level restarts); culprit: {culprit(first)}"
        )
    if over_limit(state, Budget.JOB):
        return (), (
            f"job_max_restart={limits.job_max_restart} reached ({state.job_restart_count} restarts); "
            f"culprit: {culprit(first)}"
        )
    why = f" (role {', '.join(because)} restarts the whole job)" if because else ""
    return (
        Recovery(Tier.JOB, tuple(state.actors), f"{culprit(first)}{why}", None, first.actor, first.node_id),
    ), None


def judge_inplace(
    state: JobState,
    role: str,
    reporter: str | None,
    message: str,
    dead_peers: Sequence[str],
    error: str = "",
    recovered: bool = False,
) -> InPlaceDecision:
    """Whether a failed training process is a fault of its own (tier 1) or the effect of one,
    by cause (`causality.effect_of`), never by what happens to be in flight.

    A rank's collective fails when a peer's actor died: that death is the fault, handled (and
    counted) by the role or job failover it starts, so the rank's report joins it uncounted. A
    report of the rank's own error (a crash, an exception, a hang its agent found) is a fault of
    its own: counted on it, and if a failover of its role (or of the job) is in flight, or a
    dead peer's is about to start, that recovery recovers it too (JOIN, counted). Outside
    RUNNING a job restart is under way: every report joins it. `recovered`: the report came
    after its round moved on (its SubMaster re-forms training anyway): never a restart of its own.
    """
    who = reporter or "a rank"
    if state.stage is not JobStage.RUNNING:
        return InPlaceDecision(InPlaceVerdict.JOIN, f"{who}: the job is {state.stage.value}")
    covering = _covering(state, role)
    fault = covering[1] if covering is not None else None
    nodes = {name: record.node_id for name, record in state.actors.items()}
    culprits = [name for name in dead_peers if name != reporter]
    if effect_of(Report(reporter, f"{message}\n{error}"), fault, culprits, nodes):
        if covering is not None:
            return InPlaceDecision(InPlaceVerdict.JOIN, f"{who}: part of the {covering[0]}")
        return InPlaceDecision(InPlaceVerdict.JOIN, f"{who}: its peer {', '.join(culprits)} died")
    limit = state.spec.role(role).max_restart
    if over_limit(state, Budget.IN_PLACE, role):
        reason = (
            f"role {role} reached max_restart={limit} restarting training in place; culprit: {who}: {message}"
        )
        detail = error.strip()
        return InPlaceDecision(InPlaceVerdict.STOP, f"{reason}\n{detail}" if "\n" in detail else reason)
    if covering is not None:
        why = f"{who}: a fault of its own, recovered by the {covering[0]} in flight"
        return InPlaceDecision(InPlaceVerdict.JOIN, why, counted=True)
    if culprits:
        why = f"{who}: a fault of its own, recovered by the failover of its dead peer {', '.join(culprits)}"
        return InPlaceDecision(InPlaceVerdict.JOIN, why, counted=True)
    if recovered:
        why = f"{who}: a fault of its own, found after its round moved on: recovered by the round under way"
        return InPlaceDecision(InPlaceVerdict.JOIN, why, counted=True)
    return InPlaceDecision(InPlaceVerdict.RESTART, counted=True)


def _covering(state: JobState, role: str) -> tuple[str, FaultInFlight] | None:
    """The recovery in flight that re-forms `role`'s training (its name, and the fault it
    handles): a failover of the role or of the job, or a resize of the role (whose lost nodes
    are that fault's). None when nothing is in flight for it."""
    in_flight = state.failover
    if in_flight is not None and (in_flight.tier is Tier.JOB or in_flight.role == role):
        cause = in_flight.culprit or ", ".join(in_flight.actors)
        fault = FaultInFlight(frozenset(in_flight.actors), frozenset(state.removed_nodes))
        return f"{in_flight.tier.value} failover of {cause}", fault
    resize = state.resize
    if resize is not None and resize.role == role:
        leaving = frozenset(resize.removed)
        lost = frozenset(
            node
            for name in leaving
            if name in state.actors and (node := state.actors[name].node_id) is not None
        )
        lost = lost if resize.cause.startswith(LOSS_CAUSE) else frozenset()
        return f"resize of role {role} ({resize.cause})", FaultInFlight(leaving, lost)
    return None


def setup_retry(state: JobState, actor: str, error: str) -> tuple[Recovery | None, str | None]:
    """An actor died during setup or the SubMasters' checks (Ray rebuilt it): a recovery that
    runs the checks again on its new incarnation, counted on its role like any restart; or the
    reason to stop when its role's budget is used up."""
    record = state.actors[actor]
    limit = state.spec.role(record.role).max_restart
    sub = record.rank == SUB_MASTER_RANK
    failure = Failure(actor, record.role, FailureKind.DIED, error, record.node_id)
    if over_limit(state, Budget.SUB_MASTER if sub else Budget.ROLE, record.role):
        what = "restarting its SubMaster" if sub else "setting up its actors"
        return None, with_traceback(
            f"role {record.role} reached max_restart={limit} {what}; culprit: {culprit(failure)}", failure
        )
    tier = Tier.SUB_MASTER if sub else Tier.ROLE
    why = f"{culprit(failure)} (died during the checks before start; Ray rebuilt it: checked again)"
    return Recovery(tier, (actor,), why, record.role, actor, record.node_id), None
