"""A role failover goes PrimeMaster -> SubMaster -> restart_actors -> back: never without a
deadline. A SubMaster that does not answer in time fails the failover, which escalates to a
job-level restart (the same fault's recovery going on, counted on the job's budgets)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from failover_helpers import elastic_role, running

from dlu_api.status import JobStage
from dlu_prime.scheduler.base import ActorSetupError

if TYPE_CHECKING:
    from conftest import FakeScheduler, ManagerFactory

SUB = "job.train.submaster"
E1 = "job.train.1"


def test_the_sub_master_failover_call_carries_the_timeout(make_manager: ManagerFactory) -> None:
    manager, sched = make_manager(roles=[elastic_role()])
    sched.manager = manager
    manager.executor.sub_master_timeout_s = 42.0
    running(manager, sched)
    sched.set(E1, {"stage": None})
    manager.monitor_once()
    calls = [c.names for c in sched.calls_to("call")]
    assert (SUB, "failover") in calls
    assert sched.call_timeouts[calls.index((SUB, "failover"))] == 42.0


def test_a_sub_master_that_does_not_answer_in_time_escalates_to_a_job_restart(
    make_manager: ManagerFactory,
) -> None:
    manager, sched = make_manager(roles=[elastic_role()])
    sched.manager = manager
    running(manager, sched)
    timed_out = [False]

    def hangs(s: FakeScheduler) -> None:
        if s.calls[-1].names == (SUB, "failover") and not timed_out[0]:
            timed_out[0] = True  # what the Ray scheduler raises when the deadline passes
            raise ActorSetupError(SUB, "GetTimeoutError: Get timed out: some object(s) not ready.")

    sched.on("call", hangs)
    sched.set(E1, {"stage": None})
    manager.monitor_once()
    kinds = [e.kind for e in manager.state.events]
    assert "failover_failed" in kinds and "failover_escalated" in kinds
    failed = next(e for e in manager.state.events if e.kind == "failover_failed")
    assert "GetTimeoutError" in failed.message
    assert manager.state.job_restart_count == 1
    assert manager.state.roles["train"].restart_count == 1  # the fault, counted once on its role
    assert manager.state.stage is JobStage.RUNNING
    assert manager.state.failover is None
