"""The decision core on its own: `decide(state, event, now)` returns changes and commands and
never touches the state; each outcome is decided in turn (no scheduler is called here)."""

from __future__ import annotations

import pytest
from conftest import ManagerFactory, RoleFactory
from failover_helpers import elastic_role, running

from dlu_api.status import JobStage
from dlu_api.vocabulary import ActorStage, FailureKind, InPlaceVerdict, Tier
from dlu_prime.master.changes import (
    ActorsPlaced,
    ActorsRestarting,
    FailoverBegan,
    FailoverEnded,
    FailuresCounted,
    InPlaceJudged,
    MasterRestarted,
    Observed,
    StageChanged,
)
from dlu_prime.master.core import decide, failover_chain
from dlu_prime.master.core.commands import (
    Cleanup,
    FindDeadNodes,
    FindDeadPeers,
    ForgetLiveness,
    Purpose,
    ReplaceActors,
    ReplacedSeen,
    RunChecks,
    SeeReplaced,
    StartActors,
    StopActors,
    SubMasterFailover,
    Then,
)
from dlu_prime.master.core.decision import Decision
from dlu_prime.master.core.events import (
    CarryOn,
    Done,
    InPlaceReported,
    MasterRebuilt,
    PassApplied,
    PassObserved,
    RecoveryFailed,
    RestartRequested,
    StopRequested,
    Tick,
)
from dlu_prime.master.failover import Recovery, plan_failover
from dlu_prime.master.lifecycle import EXIT_FAILED, EXIT_STOPPED, RestartLimitError
from dlu_prime.master.monitor import Assessment, Failure
from dlu_prime.master.state import FailoverRecord, JobState
from dlu_prime.naming import sub_master_name
from dlu_prime.scheduler.base import ActorObservation

T0, T1 = "job.trainer.0", "job.trainer.1"
E0, E1 = "job.train.0", "job.train.1"
SUB = sub_master_name("job", "train")
NOW = 2_000.0


def _running_state(make_manager: ManagerFactory, **kw: object) -> JobState:
    manager, sched = make_manager(**kw)
    running(manager, sched)
    return manager.state


def _pure(state: JobState, event: object) -> Decision:
    before = state.dumps()
    decision = decide(state, event, NOW)  # pyright: ignore[reportArgumentType]
    assert state.dumps() == before, "decide changed the state"
    return decision


def test_a_crash_is_recorded_then_judged_with_the_dead_nodes_view(make_manager: ManagerFactory) -> None:
    state = _running_state(make_manager)
    failure = Failure(T1, "trainer", FailureKind.DIED, "boom", "node-1")
    event = PassObserved(Assessment(failures=(failure,)), frozenset({T1}))

    recorded = decide(state, event, NOW)
    assert [type(c) for c in recorded.changes] == [Observed]
    assert isinstance(recorded.follow, PassApplied) and not recorded.commands

    judged = decide(state, recorded.follow, NOW)
    (find,) = judged.commands
    assert isinstance(find, FindDeadNodes) and find.nodes == ("node-1",) and not judged.changes

    began = decide(state, Done(find, set[str]()), NOW)  # a simple role restarts the whole job
    assert [type(c) for c in began.changes] == [FailuresCounted, FailoverBegan, StageChanged]
    recovery = began.changes[1]
    assert isinstance(recovery, FailoverBegan) and recovery.recovery.tier is Tier.JOB
    assert began.commands == (ForgetLiveness(), ReplaceActors((T0, T1), Purpose.FAILOVER))


def test_decide_never_changes_the_state(make_manager: ManagerFactory) -> None:
    state = _running_state(make_manager)
    failure = Failure(T1, "trainer", FailureKind.DIED, "boom", "node-1")
    for event in (
        PassObserved(Assessment(failures=(failure,)), frozenset({T1})),
        RestartRequested((T0,), "node check: faulty"),
        InPlaceReported("trainer", T0, "exited 1"),
        StopRequested(EXIT_STOPPED, "user"),
        MasterRebuilt(),
    ):
        _pure(state, event)


def test_a_failed_role_recovery_escalates_to_a_job_restart_as_one_chain(make_manager: ManagerFactory) -> None:
    manager, sched = make_manager(roles=[elastic_role()])
    running(manager, sched)
    failure = Failure(E1, "train", FailureKind.DIED, "boom", "node-1")
    find = FindDeadNodes(("node-1",), (failure,), frozenset(), False)
    began = decide(manager.state, Done(find, set[str]()), NOW)
    manager.apply(*began.changes)
    (call,) = began.commands
    assert isinstance(call, SubMasterFailover) and call.sub == SUB and call.actors == (E1,)

    ended = decide(manager.state, Done(call, None, RuntimeError("no node")), NOW)
    assert isinstance(ended.changes[0], FailoverEnded) and ended.changes[0].error == "RuntimeError: no node"
    assert isinstance(ended.follow, RecoveryFailed)
    manager.apply(*ended.changes)

    escalated = decide(manager.state, ended.follow, NOW)
    began_job = [c for c in escalated.changes if isinstance(c, FailoverBegan)]
    assert began_job and began_job[0].escalated and began_job[0].recovery.tier is Tier.JOB
    assert any(isinstance(c, StageChanged) and c.stage is JobStage.INIT for c in escalated.changes)
    assert [type(c) for c in escalated.commands] == [ForgetLiveness, ReplaceActors]
    manager.apply(*escalated.changes)

    # The job restart's steps: replaced -> checks -> READY, RUNNING and start -> ended.
    replaced = decide(manager.state, Done(escalated.commands[1], {E0: "n0", E1: "n1", SUB: "n0"}), NOW)
    assert isinstance(replaced.changes[0], ActorsPlaced)
    (checks,) = replaced.commands
    assert isinstance(checks, RunChecks) and checks.purpose is Purpose.FAILOVER
    manager.apply(*replaced.changes)
    checked = decide(manager.state, Done(checks), NOW)
    assert [c.stage for c in checked.changes if isinstance(c, StageChanged)] == [
        JobStage.READY,
        JobStage.RUNNING,
    ]
    (start,) = checked.commands
    assert isinstance(start, StartActors) and start.names == (SUB,)  # the SubMaster starts its ranks
    manager.apply(*checked.changes)
    done = decide(manager.state, Done(start), NOW)
    assert isinstance(done.changes[0], FailoverEnded) and done.changes[0].error is None
    assert isinstance(done.follow, CarryOn)


def test_a_restart_request_is_counted_and_limited_before_anything_is_replaced(
    make_manager: ManagerFactory, make_role: RoleFactory
) -> None:
    state = _running_state(make_manager, roles=[make_role("trainer", 2, max_restart=0)])
    unknown = decide(state, RestartRequested(("nope",), "x"), NOW)
    assert isinstance(unknown.error, KeyError) and not unknown.commands
    over = decide(state, RestartRequested((T0,), "x"), NOW)
    assert isinstance(over.error, RestartLimitError) and not over.changes and not over.commands

    state = _running_state(make_manager)
    asked = decide(state, RestartRequested((T0,), "node check: faulty"), NOW)
    assert [type(c) for c in asked.changes] == [ActorsRestarting]
    assert asked.commands == (ReplaceActors((T0,), Purpose.RESTART_REQUEST),)


def test_an_inplace_report_asks_for_its_peers_then_is_judged(make_manager: ManagerFactory) -> None:
    state = _running_state(make_manager)
    report = InPlaceReported("trainer", T0, "exited 1", "ValueError: boom")
    asked = decide(state, report, NOW)
    (find,) = asked.commands
    assert isinstance(find, FindDeadPeers) and set(find.peers) == {T1} and not asked.changes
    judged = decide(state, Done(find, []), NOW)
    assert judged.reply is not None and judged.reply.verdict is InPlaceVerdict.RESTART
    assert [type(c) for c in judged.changes] == [InPlaceJudged]


def test_a_stop_is_one_chain_and_a_second_one_is_nothing(make_manager: ManagerFactory) -> None:
    manager, sched = make_manager()
    running(manager, sched)
    stop = decide(manager.state, StopRequested(EXIT_FAILED, "limit"), NOW)
    assert [c.stage for c in stop.changes if isinstance(c, StageChanged)] == [JobStage.STOPPING]
    assert [type(c) for c in stop.commands] == [StopActors, Cleanup]
    manager.apply(*stop.changes)
    assert decide(manager.state, StopRequested(EXIT_STOPPED, "again"), NOW).changes == ()
    cleaned = decide(manager.state, Done(Cleanup()), NOW)
    assert [c.stage for c in cleaned.changes if isinstance(c, StageChanged)] == [JobStage.STOPPED]


@pytest.mark.parametrize("stage", [JobStage.INIT, JobStage.READY])
def test_a_master_rebuilt_in_a_short_lived_stage_counts_and_stops(
    make_manager: ManagerFactory, stage: JobStage
) -> None:
    manager, _ = make_manager()
    if stage is JobStage.READY:
        manager.prepare()
    decision = decide(manager.state, MasterRebuilt(), NOW)
    assert isinstance(decision.changes[0], MasterRestarted)
    stopping = [c for c in decision.changes if isinstance(c, StageChanged)]
    assert stopping and stopping[0].stage is JobStage.STOPPING and "short-lived stage" in stopping[0].reason


def _saved(
    state: JobState,
    tier: Tier,
    role: str,
    actors: list[str],
    placed: bool,
    alive: list[str] | None = None,
    rebuilt: list[str] | None = None,
) -> JobState:
    """A failover saved in flight as `_began` saves it; `placed`: its replacements placed since;
    `alive`: its actors alive as it began (a mark, a hang); `rebuilt`: those Ray rebuilt."""
    state = state.model_copy(deep=True)
    state.failover = FailoverRecord(
        tier=tier,
        role=role,
        actors=actors,
        reason="x",
        started_at=0,
        alive=alive or [],
        rebuilt=rebuilt or [],
    )
    for name in actors:
        state.actors[name].stage = ActorStage.READY if placed else ActorStage.INIT
    return state


def test_a_rebuilt_master_looks_at_a_saved_failovers_placed_replacements_first(
    make_manager: ManagerFactory,
) -> None:
    base = _running_state(make_manager, roles=[elastic_role()])
    unplaced = _saved(base, Tier.ROLE, "train", [E1], placed=False)
    node = unplaced.actors[E1].node_id
    assert node is not None
    first = _pure(unplaced, Tick())  # looked at too: the dead one may have placed it, unsaved
    assert first.commands == (SeeReplaced((E1,), (node,)),)
    where_it_died = ReplacedSeen({E1: ActorObservation.gone("lost", node)}, False, frozenset({node}))
    assert [type(c) for c in _pure(unplaced, Done(first.commands[0], where_it_died)).commands] == [
        SubMasterFailover
    ]
    placed = _saved(base, Tier.ROLE, "train", [E1], placed=True)
    look = _pure(placed, Tick())
    assert look.commands == (SeeReplaced((E1,)),)
    alive = ReplacedSeen(
        {E1: ActorObservation(stage=ActorStage.RUNNING, node_id="node-1")}, has_extension=False
    )
    assert [type(c) for c in _pure(placed, Done(look.commands[0], alive)).commands] == [SubMasterFailover]
    dead = ReplacedSeen({E1: ActorObservation.gone("node lost")}, has_extension=False)
    judged = _pure(placed, Done(look.commands[0], dead))
    assert [type(c) for c in judged.changes] == [Observed] and isinstance(judged.follow, PassApplied)
    assert [f.actor for f in judged.follow.observed.assessment.failures] == [E1]


def test_a_death_of_an_actor_a_saved_failover_has_yet_to_replace_is_judged_only_if_its_own(
    make_manager: ManagerFactory,
) -> None:
    """Seed 17404: an actor marked unhealthy, its failover saved, then its process killed before
    the rebuilt PrimeMaster resumed: Ray's rebuild of it is a new fault (the failover's restart
    kills for good). One the failover began for because it died is not judged again (seed 194),
    nor one gone on a live node (the dead PrimeMaster may have killed it half way through)."""
    base = _running_state(make_manager, roles=[elastic_role()])
    marked = _saved(base, Tier.ROLE, "train", [E1], placed=False, alive=[E1])
    node = marked.actors[E1].node_id
    assert node is not None
    look = _pure(marked, Tick())
    assert look.commands == (SeeReplaced((E1,), (node,)),)
    rebuilt = ActorObservation(stage=ActorStage.INIT, node_id=node, reconstructed=True)
    judged = _pure(marked, Done(look.commands[0], ReplacedSeen({E1: rebuilt}, has_extension=False)))
    assert isinstance(judged, Decision) and isinstance(judged.follow, PassApplied)
    (failure,) = judged.follow.observed.assessment.failures
    assert failure.actor == E1 and failure.kind is FailureKind.RESTARTED and failure.unreplaced
    gone = ReplacedSeen({E1: ActorObservation.gone("lost")}, has_extension=False)
    assert [type(c) for c in _pure(marked, Done(look.commands[0], gone)).commands] == [SubMasterFailover]
    lost = ReplacedSeen(
        {E1: ActorObservation.gone("lost")}, has_extension=False, dead_nodes=frozenset({node})
    )
    judged = _pure(marked, Done(look.commands[0], lost))
    assert isinstance(judged, Decision) and isinstance(judged.follow, PassApplied)
    assert [f.kind for f in judged.follow.observed.assessment.failures] == [FailureKind.DIED]
    died = _saved(base, Tier.ROLE, "train", [E1], placed=False)  # begun for its death
    assert _pure(died, Tick()).commands == (SeeReplaced((E1,), (node,)),)
    again = ReplacedSeen({E1: rebuilt}, has_extension=False)  # not judged again
    assert [type(c) for c in _pure(died, Done(look.commands[0], again)).commands] == [SubMasterFailover]


def test_a_replacement_the_dead_master_placed_unsaved_and_lost_with_its_node_is_counted(
    make_manager: ManagerFactory,
) -> None:
    """Seed 22974: a failover begun for a death (its actor saved where it died), the dead
    PrimeMaster's replacement placed but not saved, then lost with its node before the resume:
    gone from another node Ray marks dead, it is a fault of its own, counted on it and there.
    Gone where it died is the death the failover began for; from a live node, not a loss."""
    base = _running_state(make_manager, roles=[elastic_role()])
    died = _saved(base, Tier.ROLE, "train", [E1], placed=False)
    node = died.actors[E1].node_id
    assert node is not None
    look = _pure(died, Tick())
    assert look.commands == (SeeReplaced((E1,), (node,)),)
    gone_elsewhere = ActorObservation.gone("node lost", "node-new")
    lost = ReplacedSeen({E1: gone_elsewhere}, False, frozenset({node, "node-new"}))
    judged = _pure(died, Done(look.commands[0], lost))
    assert isinstance(judged, Decision) and isinstance(judged.follow, PassApplied)
    (failure,) = judged.follow.observed.assessment.failures
    assert (failure.actor, failure.kind, failure.node_id) == (E1, FailureKind.DIED, "node-new")
    assert failure.unreplaced
    for not_a_new_loss in (
        ReplacedSeen({E1: ActorObservation.gone("lost", node)}, False, frozenset({node, "node-new"})),
        ReplacedSeen({E1: gone_elsewhere}, False, frozenset({node})),  # its node is alive
        ReplacedSeen({E1: ActorObservation.gone("lost")}, False, frozenset({node})),  # nowhere known
    ):
        resumed = _pure(died, Done(look.commands[0], not_a_new_loss))
        assert [type(c) for c in resumed.commands] == [SubMasterFailover], not_a_new_loss


def test_an_actor_ray_rebuilt_then_lost_with_its_node_before_the_resume_is_counted(
    make_manager: ManagerFactory,
) -> None:
    """Seed 57311: a failover begun because Ray rebuilt its actor on a live node, the PrimeMaster
    killed before it replaced it, then that node lost before the rebuilt one resumed: gone for
    good where it ran, with that node dead, is a loss of its own. A failover begun for a death
    there sees the same and counts nothing (the death it began for); a rebuilt actor gone from a
    live node is the dead PrimeMaster's restart, half way."""
    base = _running_state(make_manager, roles=[elastic_role()])
    rebuilt = _saved(base, Tier.ROLE, "train", [E1], placed=False, rebuilt=[E1])
    node = rebuilt.actors[E1].node_id
    assert node is not None
    look = _pure(rebuilt, Tick())
    assert look.commands == (SeeReplaced((E1,), (node,)),)
    for where in (node, None):  # Ray's record of it names the node, or nothing (the saved one)
        lost = ReplacedSeen({E1: ActorObservation.gone("node lost", where)}, False, frozenset({node}))
        judged = _pure(rebuilt, Done(look.commands[0], lost))
        assert isinstance(judged, Decision) and isinstance(judged.follow, PassApplied)
        (failure,) = judged.follow.observed.assessment.failures
        assert (failure.actor, failure.kind, failure.node_id, failure.unreplaced) == (
            E1,
            FailureKind.DIED,
            node,
            True,
        )
    died = _saved(base, Tier.ROLE, "train", [E1], placed=False)
    for state, seen in (
        (died, ReplacedSeen({E1: ActorObservation.gone("lost", node)}, False, frozenset({node}))),
        (rebuilt, ReplacedSeen({E1: ActorObservation.gone("killed", node)}, False, frozenset())),
    ):
        resumed = _pure(state, Done(look.commands[0], seen))
        assert [type(c) for c in resumed.commands] == [SubMasterFailover], seen


def test_a_loss_of_a_node_other_actors_sat_on_is_left_to_the_next_pass(make_manager: ManagerFactory) -> None:
    """Seed 7395: the node of a saved failover's rebuilt actor held other actors too. The next
    pass finds them gone with it and judges the loss there (one count on the node, the elastic
    shrink or a SubMaster's recovery); counted in the resume as well, it was counted twice."""
    base = _running_state(make_manager, roles=[elastic_role()])
    rebuilt = _saved(base, Tier.ROLE, "train", [E1], placed=False, rebuilt=[E1])
    node = rebuilt.actors[E1].node_id
    assert node is not None and rebuilt.actors[E0].node_id != node
    look = _pure(rebuilt, Tick())
    lost = ReplacedSeen({E1: ActorObservation.gone("node lost", node)}, False, frozenset({node}))
    judged = _pure(rebuilt, Done(look.commands[0], lost))
    assert isinstance(judged.follow, PassApplied)  # nobody else there: counted in the resume
    shared = rebuilt.model_copy(deep=True)
    shared.actors[E0].node_id = node  # a rank outside the failover on that node too
    resumed = _pure(shared, Done(look.commands[0], lost))
    assert [type(c) for c in resumed.commands] == [SubMasterFailover]


def test_a_role_failover_records_the_actors_ray_rebuilt(make_manager: ManagerFactory) -> None:
    """What the rule above reads: a failover begun for a reconstruction names its actor rebuilt."""
    state = _running_state(make_manager, roles=[elastic_role()])
    node = state.actors[E1].node_id
    failures = (
        Failure(E1, "train", FailureKind.RESTARTED, "actor process died; Ray reconstructed it", node),
    )
    plan = plan_failover(state, failures, has_extension=False)
    (recovery,) = plan.recoveries
    assert (recovery.actors, recovery.rebuilt, recovery.alive) == ((E1,), (E1,), ())
    killed = (Failure(E1, "train", FailureKind.DIED, "actor died", node),)
    (recovery,) = plan_failover(state, killed, has_extension=False, dead_nodes={node or ""}).recoveries
    assert recovery.rebuilt == ()


class _Gone:
    """A scheduler where one actor is gone (its poll knows no node), Ray's record of it says
    where it last ran, and that node is dead."""

    def __init__(self) -> None:
        self.asked_dead: list[list[str]] = []
        self.asked_last: list[list[str]] = []

    def poll(self, names: list[str]) -> dict[str, ActorObservation]:
        return {
            E0: ActorObservation(stage=ActorStage.RUNNING, node_id="n0"),
            E1: ActorObservation.gone("died"),
        }

    def last_nodes(self, names: list[str]) -> dict[str, str]:
        self.asked_last.append(list(names))
        return {E1: "node-new"}

    def dead_nodes(self, nodes: list[str]) -> set[str]:
        self.asked_dead.append(list(nodes))
        return {"node-new"} & set(nodes)


def test_the_executor_tells_where_a_gone_actor_of_a_saved_failover_last_ran() -> None:
    from typing import Any, cast

    from dlu_prime.master.executor import Callbacks, Executor
    from dlu_prime.scheduler.base import Scheduler

    scheduler = _Gone()
    callbacks = Callbacks(lambda: None, lambda reason, failed: None, lambda: None, lambda: [])
    executor = Executor(cast(Scheduler, cast(Any, scheduler)), callbacks)
    done = executor.run(SeeReplaced((E0, E1), ("n1",)))
    seen = done.value
    assert isinstance(seen, ReplacedSeen) and done.error is None
    assert scheduler.asked_last == [[E1]]  # only the gone one
    assert seen.observations[E1].node_id == "node-new" and seen.observations[E0].node_id == "n0"
    assert scheduler.asked_dead == [["n1", "node-new"]] and seen.dead_nodes == {"node-new"}


def test_the_failure_of_an_unreplaced_actor_of_its_own_is_counted_not_ignored(
    make_manager: ManagerFactory,
) -> None:
    state = _saved(_running_state(make_manager), Tier.ROLE, "trainer", [T1], placed=False, alive=[T1])
    failure = Failure(T1, "trainer", FailureKind.RESTARTED, "rebuilt", None)
    assert plan_failover(state, [failure], has_extension=False).ignored == (failure,)
    own = Failure(T1, "trainer", FailureKind.RESTARTED, "rebuilt", None, unreplaced=True)
    plan = plan_failover(state, [own], has_extension=False)
    assert not plan.ignored and plan.counted == (own,) and plan.recoveries


def test_a_job_restart_saved_in_running_only_starts_its_live_actors(make_manager: ManagerFactory) -> None:
    """Seed 17842: its actors were replaced and passed their checks; replacing them all again
    would absorb a death since. The live ones are started (the restart ends after), the dead
    are the next pass's to judge."""
    base = _running_state(make_manager)
    state = _saved(base, Tier.JOB, "", list(base.actors), placed=True)
    state.failover = state.failover.model_copy(update={"role": None}) if state.failover else None
    look = _pure(state, Tick())
    assert isinstance(look, Decision) and look.commands == (SeeReplaced(tuple(base.actors)),)
    seen = {n: ActorObservation(stage=ActorStage.READY, node_id="node-1") for n in base.actors}
    seen[T1] = ActorObservation.gone("node lost")
    started = _pure(state, Done(look.commands[0], ReplacedSeen(seen, has_extension=False)))
    assert isinstance(started, Decision) and len(started.commands) == 1
    start = started.commands[0]
    assert isinstance(start, StartActors) and T1 not in start.names and start.names
    ended = _pure(state, Done(start, None))
    assert isinstance(ended, Decision) and [type(c) for c in ended.changes] == [FailoverEnded]


def test_the_ranks_lost_with_their_sub_masters_node_join_its_recovery(make_manager: ManagerFactory) -> None:
    """Seed 16919: the SubMaster and ranks of one dead node are one fault, counted once on the
    SubMaster (a second, counted failover of the role was what broke)."""
    state = _running_state(make_manager, roles=[elastic_role()])
    node = state.actors[SUB].node_id
    mates = [n for n, a in state.actors.items() if a.node_id == node and n != SUB]
    assert node is not None and mates
    died = Failure(SUB, "train", FailureKind.DIED, "node lost", node)
    plan = plan_failover(state, [died], has_extension=False, dead_nodes={node})
    sub, ranks = plan.recoveries
    assert sub.tier is Tier.SUB_MASTER and not sub.joined
    assert ranks.tier is Tier.ROLE and ranks.joined and set(ranks.actors) == set(mates)


def test_a_role_failover_taking_a_saved_sub_master_one_along_keeps_its_tier(
    make_manager: ManagerFactory,
) -> None:
    """The SubMaster of the saved one is replaced and set up, then the ranks started; the new
    fault (a rank's) is counted on its role, the saved one's actors uncounted again."""
    state = _saved(
        _running_state(make_manager, roles=[elastic_role()]), Tier.SUB_MASTER, "train", [SUB, E0], True
    )
    recovery = Recovery(Tier.ROLE, (E0,), "E0 died", "train", E0)
    decision = failover_chain.begin(state, recovery, Then())
    began = decision.changes[0]
    assert isinstance(began, FailoverBegan) and began.widens == (SUB,) and began.tier is Tier.SUB_MASTER
    assert decision.commands == (ReplaceActors((E0, SUB), Purpose.FAILOVER, Then()),)


def test_the_recovery_of_the_role_in_flight_begins_first(
    make_manager: ManagerFactory, make_role: RoleFactory
) -> None:
    """Begun after another role's, it would find the saved one ended unfinished."""
    roles = [make_role("trainer", 2, recovery="in_place"), elastic_role()]
    state = _saved(_running_state(make_manager, roles=roles), Tier.ROLE, "train", [E1], True)
    other = Recovery(Tier.ROLE, (T0,), "T0 died", "trainer", T0)
    own = Recovery(Tier.ROLE, (E1,), "E1 died", "train", E1)
    decision = failover_chain.carry_on(state, Then((other, own)))
    began = decision.changes[0]
    assert isinstance(began, FailoverBegan) and began.recovery == own
    assert isinstance(decision.commands[0], SubMasterFailover)
    assert decision.commands[0].then == Then((other,))
