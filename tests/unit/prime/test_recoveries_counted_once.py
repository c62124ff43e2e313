"""Issue 27 defect 9: one `dlu debug mark-unhealthy` showed as two recoveries (the second
`failover_done -> failover_done`), and a SubMaster restart showed nowhere in its role's status."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from failover_helpers import elastic_role, running

from dlu_api.cli.console_model import restarts_by_tier
from dlu_api.cli.render import role_line
from dlu_api.recovery import recoveries, recovery_lines
from dlu_prime.master.manager import PrimeManager
from dlu_prime.naming import sub_master_name

if TYPE_CHECKING:
    from conftest import ManagerFactory

SUB = sub_master_name("job", "train")


def test_one_mark_unhealthy_is_one_recovery(make_manager: ManagerFactory) -> None:
    manager, sched = make_manager(roles=[elastic_role()])
    running(manager, sched)
    manager.debug.mark_unhealthy(manager.debug.worker_names("train", 0), "marked unhealthy for testing")
    manager.monitor_once()
    found = recoveries(manager.status(events=1000).events)
    assert len(found) == 1, recovery_lines(manager.state.events)
    only = found[0]
    assert (only.failure.kind, only.done and only.done.kind, only.tier) == (
        "error_report",
        "failover_done",
        "role",
    )
    assert manager.state.roles["train"].restart_count == 1


def test_a_sub_master_restart_shows_in_its_role(make_manager: ManagerFactory) -> None:
    manager, sched = make_manager(roles=[elastic_role()])
    running(manager, sched)
    sched.set(SUB, {"stage": None, "error": "SubMaster died"})
    manager.monitor_once()
    status = manager.status()
    role = next(r for r in status.roles if r.name == "train")
    assert role.sub_master_restart_count == 1
    assert "1 SubMaster restart(s)" in role_line(role)
    assert ("SubMaster", 1) in restarts_by_tier(status)
    assert len(recoveries(status.events)) == 1


def test_a_retried_mark_unhealthy_is_not_marked_twice(make_manager: ManagerFactory, store: Any) -> None:
    """A `dlu debug mark-unhealthy` asked again of a rebuilt PrimeMaster (same request id)."""
    manager, sched = make_manager(roles=[elastic_role()])
    running(manager, sched)
    names = manager.debug.worker_names("train", 0)
    assert manager.debug.mark_unhealthy(names, "marked", request_id="d-1")
    manager.monitor_once()
    again = PrimeManager.self_recover(manager.state.spec, sched, store, clock=manager.clock)
    assert again is not None
    sched.manager = again
    assert not again.debug.mark_unhealthy(names, "marked", request_id="d-1")  # the retry
    again.monitor_once()
    assert len(recoveries(again.status(events=1000).events)) == 1
    assert again.state.roles["train"].restart_count == 1
