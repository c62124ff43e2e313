"""Regression tests for the known traps of DESIGN section 4, one per trap.

Where a trap needs real Ray, its test lives with the integration tests:
- placement groups owned by the PrimeMaster: tests/integration/test_runtime_sdk.py
  (test_prime_master_restart_resumes_without_touching_workers);
- one global actor name / state left under the job's key: tests/integration/test_job_lifecycle.py
  (test_two_jobs_run_side_by_side, test_resubmitted_job_does_not_reuse_finished_state);
- memory in MB instead of bytes: tests/unit/prime/test_placement.py
  (test_memory_is_bytes_in_bundle_and_actor_options);
- a default evaluated once: tests/unit/prime/test_manager_stages.py (the timestamp test);
- a failed node check left in READY: tests/integration/test_elastic.py
  (test_comm_fault_node_check_failure_stops_the_job_naming_the_node).
The others are here, against the PrimeManager with the fake scheduler.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

from failover_helpers import elastic_role, running

from dlu_api.status import JobStage
from dlu_api.vocabulary import ActorStage
from dlu_prime.master.manager import PrimeManager
from dlu_prime.master.state import JobState

if TYPE_CHECKING:
    from conftest import ManagerFactory, RecordingStore, RoleFactory

E1 = "job.train.1"


def test_a_primemaster_restart_in_running_restarts_no_worker(
    make_manager: ManagerFactory, store: RecordingStore
) -> None:
    """Trap: `len(x) == 0` written for `!= 0` turned every PrimeMaster restart into a job restart."""
    manager, sched = make_manager(roles=[elastic_role()])
    running(manager, sched)
    stored = store.get("job")
    assert stored is not None
    again = PrimeManager(JobState.loads(stored.data), sched, store, stored.token, clock=manager.clock)
    for _ in range(3):
        again.monitor_once()
    assert not sched.calls_to("restart") and not sched.calls_to("call")
    assert again.state.stage is JobStage.RUNNING and again.state.job_restart_count == 0


def test_a_job_level_restart_leaves_one_monitoring_loop(
    make_manager: ManagerFactory, make_role: RoleFactory
) -> None:
    """Trap: a monitoring task that cancelled itself from inside left two loops running. Here
    the restart runs inside the one loop; no thread is started for it."""
    manager, sched = make_manager(roles=[make_role("trainer", 2)])
    before = threading.active_count()
    sched.script(
        {},
        {"job.trainer.1": {"stage": ActorStage.FAILED, "error": "boom"}},
        {},
        {"trainer": ActorStage.FINISH},
    )
    sched.on("start", lambda s: [s.set(n, ActorStage.RUNNING) for n in s.names_of("trainer")])
    during: list[int] = []
    sched.on("restart", lambda s: during.append(threading.active_count()))
    manager.run()
    assert during == [before]
    assert manager.state.job_restart_count == 1 and manager.state.exit_code == 0


def test_counters_are_saved_before_the_recovery_acts(make_manager: ManagerFactory) -> None:
    """Trap: counters incremented but not saved were lost on a PrimeMaster restart."""
    manager, sched = make_manager(roles=[elastic_role()])
    running(manager, sched)
    sched.set(E1, {"stage": ActorStage.FAILED, "error": "boom"})
    manager.monitor_once()
    restart = sched.only_call("restart")
    assert restart.stored is not None
    assert restart.stored.roles["train"].restart_count == 1
    assert restart.stored.actors[E1].restart_count == 1
    assert restart.stored.node_failures == {"node-1": 1}


def test_the_in_flight_record_is_cleared_when_the_recovery_fails(make_manager: ManagerFactory) -> None:
    """Trap: a 'failover in progress' flag not cleared on one branch hung the next failure."""
    manager, sched = make_manager(roles=[elastic_role()], limits={"global_restart_budget": 0})
    running(manager, sched)
    sched.restart_failures[E1] = "replacement failed its self check"
    sched.set(E1, {"stage": ActorStage.FAILED, "error": "boom"})
    manager.monitor_once()
    assert manager.state.failover is None
    assert manager.state.stage is JobStage.STOPPED
    assert manager.state.reason.startswith("global_restart_budget=0 used up")
