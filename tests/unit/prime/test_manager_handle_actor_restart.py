"""The failover seed's `deal_with_actor_restarting` and failover handling, with the fake scheduler.

Families named after the seed's test coverage: actor restart handling (normal failure, failure
on a removed node, failure over the per-node limit), stop cases (each limit), save/load and
PrimeMaster failover during a recovery, deduplication, and the recovery policies.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import pytest
from failover_helpers import elastic_role, running

from dlu_api.status import JobStage
from dlu_api.vocabulary import ActorStage, InPlaceVerdict, Tier
from dlu_prime.extension import Extension, NodeInfo
from dlu_prime.master.failover import plan_failover
from dlu_prime.master.manager import EXIT_FAILED, EXIT_OK, PrimeManager
from dlu_prime.master.monitor import Failure
from dlu_prime.master.state import FailoverRecord, JobState
from dlu_prime.naming import sub_master_name
from dlu_prime.scheduler.base import ActorSetupError

if TYPE_CHECKING:
    from conftest import FakeScheduler, ManagerFactory, RecordingStore, RoleFactory

T0, T1 = "job.trainer.0", "job.trainer.1"
E0, E1 = "job.train.0", "job.train.1"
SUB = sub_master_name("job", "train")


def kinds(state: JobState, kind: str) -> list[str]:
    return [e.message for e in state.events if e.kind == kind]


# actor restart handling --------------------------------------------------------------------
def test_normal_failure_is_counted_on_its_node_and_recovered_at_the_role_tier(
    make_manager: ManagerFactory,
) -> None:
    manager, sched = make_manager(roles=[elastic_role()])
    running(manager, sched)
    sched.set(E1, {"stage": ActorStage.INIT, "reconstructed": True})  # Ray rebuilt it: RESTARTED
    manager.monitor_once()

    state = manager.state
    assert state.node_failures == {"node-1": 1}
    assert state.roles["train"].restart_count == 1 and state.actors[E1].restart_count == 1
    assert [c.names for c in sched.calls_to("call")] == [(SUB, "failover")]
    assert sched.only_call("restart").names == (E1,)  # only the failed rank's actor
    assert state.failover is None and state.stage is JobStage.RUNNING
    done = [e for e in state.events if e.kind == "failover_done"]
    assert len(done) == 1 and done[0].tier == Tier.ROLE and done[0].duration_s is not None
    assert kinds(state, "restarted") == ["actor process died; Ray reconstructed it on node node-1"]
    # The failover was saved (counted, in flight) before the SubMaster was asked.
    call = sched.calls_to("call")[0]
    assert call.stored is not None and call.stored.failover is not None
    assert call.stored.roles["train"].restart_count == 1


def test_failure_on_a_removed_node_resets_its_count_and_is_not_a_failure(
    make_manager: ManagerFactory,
) -> None:
    manager, sched = make_manager(roles=[elastic_role()])
    running(manager, sched)
    manager.state.removed_nodes.append("node-1")
    manager.state.node_failures["node-1"] = 5
    sched.set(E1, {"stage": ActorStage.INIT, "reconstructed": True})
    manager.monitor_once()

    assert manager.state.node_failures["node-1"] == 0
    assert manager.state.roles["train"].restart_count == 1  # still recovered
    assert sched.only_call("restart").names == (E1,)


class RecordingExtension(Extension):
    def __init__(self, spec: Any) -> None:
        super().__init__(spec)
        self.asked: list[list[NodeInfo]] = []

    def relaunch_nodes_impl(self, nodes: list[NodeInfo]) -> list[NodeInfo]:
        self.asked.append(nodes)
        return [NodeInfo(f"{n.node_id}-new") for n in nodes]


def test_failure_over_the_per_node_limit_relaunches_the_node_then_recovers(
    make_manager: ManagerFactory,
) -> None:
    manager, sched = make_manager(roles=[elastic_role(per_node_max_failure=1)])
    extension = RecordingExtension(manager.state.spec)
    manager.extension = extension
    running(manager, sched)
    manager.state.node_failures["node-1"] = 1
    sched.set(E1, {"stage": ActorStage.FAILED, "error": "boom"})
    manager.monitor_once()

    state = manager.state
    assert [[n.node_id for n in call] for call in extension.asked] == [["node-1"]]
    assert extension.asked[0][0].actors == (E1,)
    assert state.removed_nodes == ["node-1"] and state.node_restart_count == 1
    assert state.node_failures["node-1"] == 0  # reset by the relaunch
    assert sched.only_call("restart").names == (E1,)
    assert [e.kind for e in state.events if e.tier == Tier.NODE] == ["node_relaunch", "node_relaunched"]


def test_over_the_per_node_limit_without_an_extension_is_noted_and_recovered(
    make_manager: ManagerFactory,
) -> None:
    manager, sched = make_manager(roles=[elastic_role(per_node_max_failure=1)])
    running(manager, sched)
    manager.state.node_failures["node-1"] = 1
    sched.set(E1, {"stage": ActorStage.FAILED, "error": "boom"})
    manager.monitor_once()
    assert manager.state.removed_nodes == []
    assert "no extension is configured" in kinds(manager.state, "node_limit")[0]
    assert manager.state.roles["train"].restart_count == 1


# recovery policies ---------------------------------------------------------------------------------
def test_a_role_without_sub_master_restarts_the_whole_job(
    make_manager: ManagerFactory, make_role: RoleFactory
) -> None:
    manager, sched = make_manager(roles=[make_role("trainer", 2), make_role("server", 1, is_driver=False)])
    running(manager, sched)
    sched.set(T1, {"stage": ActorStage.FAILED, "error": "boom"})
    manager.monitor_once()

    state = manager.state
    assert state.job_restart_count == 1 and state.global_restart_count == 1
    assert set(sched.only_call("restart").names) == set(state.actors)
    assert [m.split(":")[0] for m in kinds(state, "stage")][-3:] == [
        "RUNNING -> INIT",
        "INIT -> READY",
        "READY -> RUNNING",
    ]
    assert state.stage is JobStage.RUNNING and state.failover is None


def test_an_in_place_role_without_sub_master_restarts_only_its_failed_actor(
    make_manager: ManagerFactory, make_role: RoleFactory
) -> None:
    roles = [make_role("trainer", 1), make_role("critic", 2, is_driver=False, recovery="in_place")]
    manager, sched = make_manager(roles=roles)
    running(manager, sched)
    sched.set("job.critic.1", {"reported_errors": ("critic OOM",)})
    manager.monitor_once()

    assert sched.only_call("restart").names == ("job.critic.1",)
    assert sched.calls_to("start")[-1].names == ("job.critic.1",)
    assert manager.state.job_restart_count == 0 and manager.state.roles["critic"].restart_count == 1


def test_a_role_at_its_escalation_count_goes_global(make_manager: ManagerFactory) -> None:
    manager, sched = make_manager(roles=[elastic_role(escalate_after=2)])
    running(manager, sched)
    for expected_tier in (Tier.ROLE, Tier.ROLE, Tier.JOB):
        sched.set(E0, {"stage": ActorStage.FAILED, "error": "boom"})
        manager.monitor_once()
        assert [e.tier for e in manager.state.events if e.kind == "failover_done"][-1] == expected_tier
        for name in sched.actors:
            sched.actors[name].stage = ActorStage.RUNNING
    assert manager.state.roles["train"].escalation_count == 0  # reset by the job-level restart


def test_sub_master_failure_is_set_up_again_and_recovered_to_running(make_manager: ManagerFactory) -> None:
    manager, sched = make_manager(roles=[elastic_role()])
    running(manager, sched)
    sched.set(SUB, {"stage": None, "error": "SubMaster died"})
    manager.monitor_once()

    assert sched.only_call("restart").names == (SUB,)
    assert [c.names for c in sched.calls_to("call")] == [(SUB, "recover_running")]
    assert manager.state.roles["train"].sub_master_restart_count == 1
    assert manager.state.roles["train"].restart_count == 0  # the workers were not touched


# deduplication -----------------------------------------------------------------------------------
def test_two_reports_of_one_failure_cause_one_recovery(make_manager: ManagerFactory) -> None:
    manager, sched = make_manager(roles=[elastic_role()])
    running(manager, sched)
    sched.set(E1, {"stage": ActorStage.FAILED, "error": "boom", "reported_errors": ("boom",)})
    manager.monitor_once()
    assert len(sched.calls_to("restart")) == 1
    assert manager.state.roles["train"].restart_count == 1
    # The next pass sees the replaced actor healthy: nothing more happens.
    sched.set(E1, ActorStage.RUNNING)
    manager.monitor_once()
    assert len(sched.calls_to("restart")) == 1


def test_reports_during_a_recovery_of_the_same_actors_are_ignored(
    make_manager: ManagerFactory, store: RecordingStore
) -> None:
    manager, sched = make_manager(roles=[elastic_role()])
    running(manager, sched)
    manager.state.failover = FailoverRecord(
        tier=Tier.ROLE, role="train", actors=[E1], reason="x", started_at=0
    )
    manager.state.actors[E1].stage = ActorStage.INIT  # as the failover's start saves it: to replace
    plan = plan_failover(
        manager.state, [Failure(E1, "train", "died", "killed by our restart")], has_extension=False
    )
    assert not plan.acts and len(plan.ignored) == 1


def test_a_replacement_the_recovery_already_placed_that_dies_is_a_new_fault(
    make_manager: ManagerFactory,
) -> None:
    """Replaced (saved READY) before it died: not the fault in flight's effect, counted on it."""
    manager, sched = make_manager(roles=[elastic_role()])
    running(manager, sched)
    manager.state.failover = FailoverRecord(
        tier=Tier.ROLE, role="train", actors=[E1], reason="x", started_at=0
    )
    manager.state.actors[E1].stage = ActorStage.READY
    plan = plan_failover(manager.state, [Failure(E1, "train", "died", "node lost")], has_extension=False)
    assert plan.acts and not plan.ignored
    assert [r.actors for r in plan.recoveries] == [(E1,)]


def test_reports_outside_running_are_ignored(make_manager: ManagerFactory) -> None:
    manager, _ = make_manager(roles=[elastic_role()])
    manager.state.stage = JobStage.INIT
    plan = plan_failover(manager.state, [Failure(E1, "train", "died", "x")], has_extension=False)
    assert not plan.acts and plan.ignored


def test_a_second_failure_in_the_same_role_recovers_again(make_manager: ManagerFactory) -> None:
    """The known trap: a 'failover in progress' flag never cleared made the second one hang."""
    manager, sched = make_manager(roles=[elastic_role()])
    running(manager, sched)
    for _ in range(2):
        sched.set(E0, {"stage": ActorStage.FAILED, "error": "boom"})
        manager.monitor_once()
        assert manager.state.failover is None
        sched.set(E0, ActorStage.RUNNING)
    assert manager.state.roles["train"].restart_count == 2
    assert len(kinds(manager.state, "failover_done")) == 2


def test_a_failed_role_recovery_escalates_to_a_job_restart(make_manager: ManagerFactory) -> None:
    manager, sched = make_manager(roles=[elastic_role()])
    running(manager, sched)
    sched.restart_failures[E1] = "no CUDA device"
    sched.set(E1, {"stage": ActorStage.FAILED, "error": "boom"})

    def heal(s: FakeScheduler) -> None:  # the job-level restart (2nd call) replaces all, and works
        if len(s.calls_to("restart")) > 1:
            s.restart_failures.clear()

    sched.on("restart", heal)
    manager.monitor_once()
    state = manager.state
    assert [e.kind for e in state.events if e.kind.startswith("failover_")] == [
        "failover_started",
        "failover_failed",
        "failover_escalated",  # the same fault's recovery, not another one
        "failover_done",
    ]
    assert state.job_restart_count == 1 and state.failover is None and state.stage is JobStage.RUNNING


# stop cases: each limit ------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("limit", "spec_kwargs", "roles", "expected"),
    [
        (
            "role max_restart",
            {},
            [elastic_role(max_restart=0)],
            "role train reached max_restart=0; culprit: job.train.1",
        ),
        (
            "job_max_restart",
            {"limits": {"job_max_restart": 0}},
            None,
            "job_max_restart=0 reached (0 restarts); culprit: job.trainer.1",
        ),
        (
            "global_restart_budget",
            {"limits": {"global_restart_budget": 0}},
            None,
            "global_restart_budget=0 used up (0 job-level restarts); culprit: job.trainer.1",
        ),
    ],
)
def test_request_stop_cases(
    limit: str,
    spec_kwargs: dict[str, Any],
    roles: list[dict[str, Any]] | None,
    expected: str,
    make_manager: ManagerFactory,
) -> None:
    kwargs: dict[str, Any] = dict(spec_kwargs)
    if roles is not None:
        kwargs["roles"] = roles
    manager, sched = make_manager(**kwargs)
    running(manager, sched)
    victim = E1 if roles is not None else T1
    sched.set(victim, {"stage": ActorStage.FAILED, "error": "Traceback\nValueError: boom"})
    manager.monitor_once()
    assert manager.state.stage is JobStage.STOPPED and manager.state.exit_code == EXIT_FAILED, limit
    assert manager.state.reason.startswith(expected), manager.state.reason
    assert "ValueError: boom" in manager.state.reason.splitlines()[0]
    assert not sched.calls_to("restart")


def test_node_max_restart_stops_the_job_naming_the_node(make_manager: ManagerFactory) -> None:
    manager, sched = make_manager(
        roles=[elastic_role(per_node_max_failure=1)], limits={"node_max_restart": 0}
    )
    manager.extension = RecordingExtension(manager.state.spec)
    running(manager, sched)
    manager.state.node_failures["node-1"] = 1
    sched.set(E1, {"stage": ActorStage.FAILED, "error": "boom"})
    manager.monitor_once()
    assert manager.state.exit_code == EXIT_FAILED
    assert manager.state.reason.startswith(
        "node_max_restart=0 reached relaunching node-1; first failure: job.train.1"
    )


def test_in_place_restart_limit_stops_the_job(make_manager: ManagerFactory) -> None:
    manager, sched = make_manager(roles=[elastic_role(max_restart=1)])
    running(manager, sched)
    first = manager.note_inplace_restart("train", "rank 1 exited 1", E1)
    assert first.verdict is InPlaceVerdict.RESTART
    refused = manager.note_inplace_restart("train", "rank 0 exited 1", E0)
    assert refused.verdict is InPlaceVerdict.STOP and "max_restart=1" in refused.reason
    assert f"culprit: {E0}" in refused.reason
    manager.monitor_once()
    assert manager.state.exit_code == EXIT_FAILED and "max_restart=1" in manager.state.reason
    assert manager.state.roles["train"].inplace_restart_count == 1


# save/load and PrimeMaster failover during a recovery -----------------------------------------------
def test_manager_save_load_keeps_counters_and_the_in_flight_failover(
    make_manager: ManagerFactory, store: RecordingStore
) -> None:
    manager, sched = make_manager(roles=[elastic_role()])
    running(manager, sched)
    crashed: list[JobState] = []

    def crash_in_failover(s: FakeScheduler) -> None:
        stored = store.state("job")
        assert stored is not None
        crashed.append(stored)
        raise SystemExit("PrimeMaster killed during the role failover")

    sched.on("call", crash_in_failover)
    sched.set(E1, {"stage": ActorStage.FAILED, "error": "boom"})
    with pytest.raises(SystemExit):
        manager.monitor_once()

    stored = crashed[0]
    assert stored.failover is not None and stored.failover.actors == [E1]
    assert stored.roles["train"].restart_count == 1 and stored.node_failures == {"node-1": 1}

    # A new PrimeMaster loads it and finishes the failover without counting it twice.
    sched.hooks.clear()
    loaded = store.get("job")
    assert loaded is not None
    again = PrimeManager(JobState.loads(loaded.data), sched, store, loaded.token, clock=manager.clock)
    sched.manager = again
    again.resume_in_flight()
    assert again.state.failover is None
    assert again.state.roles["train"].restart_count == 1  # not counted twice
    assert again.state.actors[E1].restart_count == 1
    assert kinds(again.state, "failover_done")


def test_a_recovered_job_finishes_normally(make_manager: ManagerFactory) -> None:
    manager, sched = make_manager(roles=[elastic_role()])
    sched.script({}, {E1: {"stage": ActorStage.FAILED, "error": "boom"}}, {}, {"train": ActorStage.FINISH})
    sched.on("start", lambda s: [s.set(n, ActorStage.RUNNING) for n in s.names_of("train")])
    manager.run()
    assert manager.state.exit_code == EXIT_OK
    assert manager.state.roles["train"].restart_count == 1


# one fault, one recovery: a peer's failed collective joins the fault being handled ----------------
def test_in_place_restart_is_counted_once_on_the_reporting_rank(make_manager: ManagerFactory) -> None:
    manager, sched = make_manager(roles=[elastic_role()])
    running(manager, sched)
    decision = manager.note_inplace_restart("train", "round 1: job.train.1 exited 1: ValueError: boom", E1)
    assert decision.verdict is InPlaceVerdict.RESTART
    assert manager.state.roles["train"].inplace_restart_count == 1
    (event,) = [e for e in manager.state.events if e.kind == "inplace_restart"]
    assert event.actor == E1 and event.tier == Tier.IN_PLACE and event.node_id == "node-1"


def test_a_peer_error_after_a_rank_actor_died_joins_that_fault(make_manager: ManagerFactory) -> None:
    """The killed rank's actor is the culprit: the healthy rank whose collective failed is not
    counted, and the death is recovered (and counted) once, at the role tier, blamed on it."""
    manager, sched = make_manager(roles=[elastic_role(max_restart=1)])
    running(manager, sched)
    sched.set(E1, {"stage": None, "error": "actor died: SIGKILL"})
    decision = manager.note_inplace_restart("train", "job.train.0 exited 1: Connection closed by peer", E0)
    assert decision.verdict is InPlaceVerdict.JOIN and E1 in decision.reason
    assert manager.state.roles["train"].inplace_restart_count == 0
    (joined,) = [e for e in manager.state.events if e.kind == "joined_recovery"]
    assert joined.actor == E0
    manager.monitor_once()
    state = manager.state
    assert state.roles["train"].restart_count == 1 and state.roles["train"].inplace_restart_count == 0
    (started,) = [e for e in state.events if e.kind == "failover_started"]
    assert started.actor == E1 and started.tier == Tier.ROLE and started.node_id == "node-1"
    assert state.stage is JobStage.RUNNING  # max_restart=1 is not exceeded by one fault


def test_reports_while_a_failover_of_the_role_is_in_flight_join_it(make_manager: ManagerFactory) -> None:
    manager, sched = make_manager(roles=[elastic_role()])
    running(manager, sched)
    joined: list[InPlaceVerdict] = []

    def peer_reports(s: FakeScheduler) -> None:  # the SubMaster's failover makes the peers fail
        joined.append(
            manager.note_inplace_restart(
                "train", "job.train.0 exited 1: gloo: Connection closed by peer", E0
            ).verdict
        )

    sched.on("call", peer_reports)
    sched.set(E1, {"stage": ActorStage.INIT, "reconstructed": True})
    manager.monitor_once()
    assert joined == [InPlaceVerdict.JOIN]
    assert manager.state.roles["train"].inplace_restart_count == 0
    assert manager.state.roles["train"].restart_count == 1


def test_a_hang_during_a_failover_of_its_role_is_counted_once_on_the_hung_rank(
    make_manager: ManagerFactory,
) -> None:
    """Defect 2: a rank hangs, then a peer's actor is killed; the hang found while the peer's
    failover is in flight is a fault of its own: counted once on the hung rank and on the
    timeline, recovered by the failover in flight (no second action)."""
    manager, sched = make_manager(roles=[elastic_role()])
    running(manager, sched)
    decisions: list[Any] = []

    def hang_report(s: FakeScheduler) -> None:
        hang = "round 1: job.train.0 exited -9: training step stuck at 20 for 8.0s (hang timeout 8s)"
        decisions.append(manager.note_inplace_restart("train", hang, E0))

    sched.on("call", hang_report)
    sched.set(E1, {"stage": ActorStage.INIT, "reconstructed": True})
    manager.monitor_once()
    (decision,) = decisions
    assert decision.verdict is InPlaceVerdict.JOIN and decision.counted
    state = manager.state
    assert state.roles["train"].inplace_restart_count == 1 and state.roles["train"].restart_count == 1
    (hang,) = [e for e in state.events if e.kind == "inplace_restart"]
    assert (
        hang.actor == E0 and "stuck at 20" in hang.message and "role failover of job.train.1" in hang.message
    )
    assert [e.actor for e in state.events if e.kind == "failover_started"] == [E1]
    assert len(sched.calls_to("call")) == 1  # one action recovered both


def test_an_own_crash_while_a_peer_is_dead_is_counted_and_joins_its_failover(
    make_manager: ManagerFactory,
) -> None:
    manager, sched = make_manager(roles=[elastic_role()])
    running(manager, sched)
    sched.set(E1, {"stage": None, "error": "actor died: SIGKILL"})
    decision = manager.note_inplace_restart("train", "job.train.0 exited 1: ValueError: boom", E0)
    assert decision.verdict is InPlaceVerdict.JOIN and decision.counted
    assert manager.state.roles["train"].inplace_restart_count == 1


def test_a_report_from_a_rank_the_failover_replaces_joins_it(make_manager: ManagerFactory) -> None:
    manager, sched = make_manager(roles=[elastic_role()])
    running(manager, sched)
    manager.state.failover = FailoverRecord(
        tier=Tier.ROLE, role="train", actors=[E1], reason="E1 died", started_at=0.0, culprit=E1
    )
    decision = manager.note_inplace_restart("train", "job.train.1 exited -9", E1)
    assert decision.verdict is InPlaceVerdict.JOIN and not decision.counted
    assert manager.state.roles["train"].inplace_restart_count == 0


def test_reports_outside_running_join_the_restart_under_way(make_manager: ManagerFactory) -> None:
    manager, _ = make_manager(roles=[elastic_role()])
    decision = manager.note_inplace_restart("train", "exited 1", E0)  # INIT: not started yet
    assert decision.verdict is InPlaceVerdict.JOIN
    assert manager.state.roles["train"].inplace_restart_count == 0


# transient is not fatal: an actor Ray rebuilt during the checks is checked again ------------------
def _dies_under_check(times: int) -> Callable[[FakeScheduler], None]:
    left = [times]

    def hook(s: FakeScheduler) -> None:
        if left[0] > 0:
            left[0] -= 1
            s.actors[SUB].incarnation += 1  # it died under the check: Ray rebuilds it
            raise ActorSetupError(SUB, "ActorUnavailableError: the actor is restarting", transient=True)

    return hook


def test_sub_master_killed_during_the_node_check_is_checked_again(make_manager: ManagerFactory) -> None:
    manager, sched = make_manager(roles=[elastic_role(max_restart=2)])
    sched.on("check_children", _dies_under_check(1))
    manager.prepare()
    state = manager.state
    assert state.stage is JobStage.READY
    assert state.roles["train"].sub_master_restart_count == 1
    assert [c.names for c in sched.calls_to("setup")][-1] == (SUB,)  # its new incarnation, set up
    assert len(sched.calls_to("check_children")) == 2
    (started,) = [e for e in state.events if e.kind == "failover_started"]
    assert started.actor == SUB and started.tier == Tier.SUB_MASTER


def test_an_actor_that_keeps_dying_in_the_checks_stops_the_job_at_its_limit(
    make_manager: ManagerFactory,
) -> None:
    manager, sched = make_manager(roles=[elastic_role(max_restart=2)])
    sched.on("check_children", _dies_under_check(10))
    manager.run()
    state = manager.state
    assert state.stage is JobStage.STOPPED and state.exit_code == EXIT_FAILED
    assert state.reason.startswith(
        f"role train reached max_restart=2 restarting its SubMaster; culprit: {SUB}"
    )
    assert len(sched.calls_to("check_children")) == 3


def test_a_check_that_fails_by_itself_is_not_retried(make_manager: ManagerFactory) -> None:
    manager, sched = make_manager(roles=[elastic_role()])

    def fails(s: FakeScheduler) -> None:
        raise ActorSetupError(SUB, "RuntimeError: node check failed: node-1 faulty")

    sched.on("check_children", fails)
    manager.run()
    assert manager.state.exit_code == EXIT_FAILED
    assert (
        manager.state.reason == f"{SUB} failed its self check: RuntimeError: node check failed: node-1 faulty"
    )
    assert len(sched.calls_to("check_children")) == 1


def test_setting_up_an_actor_still_being_rebuilt_is_the_same_fault(make_manager: ManagerFactory) -> None:
    """Ray has not finished rebuilding the SubMaster when it is set up again: that setup fails
    too, but it is the same death, counted once."""
    manager, sched = make_manager(roles=[elastic_role(max_restart=1)])
    sched.on("check_children", _dies_under_check(1))
    setups = [0]

    def still_rebuilding(s: FakeScheduler) -> None:
        setups[0] += 1
        if setups[0] in (2, 3):  # the first two setups of the new incarnation
            raise ActorSetupError(SUB, "ActorUnavailableError: restarting", transient=True)

    sched.on("setup", still_rebuilding)
    manager.prepare()
    assert manager.state.stage is JobStage.READY
    assert manager.state.roles["train"].sub_master_restart_count == 1


def test_a_rebuild_slower_than_any_timeout_is_still_one_fault(make_manager: ManagerFactory) -> None:
    """Judged by which process answers, not by a time window: setups that fail while the same
    new incarnation answers are the same death, however long Ray takes."""
    manager, sched = make_manager(roles=[elastic_role(max_restart=1)])
    sched.on("check_children", _dies_under_check(1))
    setups = [0]

    def slow_rebuild(s: FakeScheduler) -> None:
        setups[0] += 1
        if 2 <= setups[0] <= 6:
            s.clock.advance(60.0)  # far past the heartbeat timeout each time
            raise ActorSetupError(SUB, "ActorUnavailableError: restarting", transient=True)

    sched.on("setup", slow_rebuild)
    manager.prepare()
    assert manager.state.stage is JobStage.READY
    assert manager.state.roles["train"].sub_master_restart_count == 1


def test_a_new_incarnation_that_dies_again_is_a_second_fault(make_manager: ManagerFactory) -> None:
    manager, sched = make_manager(roles=[elastic_role(max_restart=5)])
    sched.on("check_children", _dies_under_check(2))
    manager.prepare()
    assert manager.state.stage is JobStage.READY
    assert manager.state.roles["train"].sub_master_restart_count == 2


def test_a_late_own_fault_is_counted_without_a_restart_of_its_own(make_manager: ManagerFactory) -> None:
    manager, sched = make_manager(roles=[elastic_role()])
    running(manager, sched)
    hang = "round 1: job.train.0 exited -9: training process sent no heartbeat for 4.0s"
    decision = manager.note_inplace_restart("train", hang, E0, recovered=True)
    assert decision.verdict is InPlaceVerdict.JOIN and decision.counted
    assert manager.state.roles["train"].inplace_restart_count == 1
