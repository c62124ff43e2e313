"""A lost node is one fault: every actor on it goes in one recovery, counted once on the first
actor seen dead there, however Ray spreads the deaths over monitoring passes (fake scheduler)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from failover_helpers import elastic_role, running

from dlu_api.vocabulary import Tier

if TYPE_CHECKING:
    from conftest import ManagerFactory

RANK = "job.train.{}".format
NODE = "node-1"  # ranks 2 and 3 (2 nodes x 2 processes)


def four_ranks(**extra: object) -> dict[str, object]:
    role = elastic_role(**extra)
    role["elastic"] = {"nnodes": 2, "nproc_per_node": 2, "node_check": {"enabled": False}}
    return role


def test_actors_of_a_lost_node_seen_in_one_pass_go_in_one_recovery(make_manager: ManagerFactory) -> None:
    manager, sched = make_manager(roles=[four_ranks()])
    sched.manager = manager
    running(manager, sched)
    assert manager.state.actors[RANK(2)].node_id == NODE
    sched.set(RANK(2), {"stage": None, "error": "actor died: node lost"})
    sched.set(RANK(3), {"unavailable": True})  # Ray is still rebuilding it: no failure of its own yet
    manager.monitor_once()
    (started,) = [e for e in manager.state.events if e.kind.startswith("failover_")][:1]
    assert started.kind == "failover_started" and started.actor == RANK(2) and started.node_id == NODE
    role_failovers = [c.names for c in sched.calls_to("call") if c.names[1] == "failover"]
    assert len(role_failovers) == 1
    assert sorted(sched.calls_to("restart")[0].names) == [RANK(2), RANK(3)]
    assert manager.state.roles["train"].restart_count == 1
    for _ in range(5):  # the next passes find nothing more to recover
        manager.monitor_once()
    assert len([e for e in manager.state.events if e.kind == "failover_started"]) == 1
    assert [e.actor for e in manager.state.events if e.kind == "node_lost"] == []


def test_every_actor_on_a_node_ray_marks_dead_joins(make_manager: ManagerFactory) -> None:
    """Rank 3's last answer came before the node died: Ray's verdict on the node is enough."""
    manager, sched = make_manager(roles=[four_ranks()])
    sched.manager = manager
    running(manager, sched)
    sched.dead = {NODE}
    sched.set(RANK(2), {"stage": None})
    manager.monitor_once()
    assert sorted(sched.calls_to("restart")[0].names) == [RANK(2), RANK(3)]
    assert manager.state.roles["train"].restart_count == 1
    assert manager.state.node_failures == {NODE: 1}  # one fault of that node, not two


def test_an_actor_that_dies_on_a_live_node_restarts_alone(make_manager: ManagerFactory) -> None:
    manager, sched = make_manager(roles=[four_ranks()])
    sched.manager = manager
    running(manager, sched)
    sched.set(RANK(2), {"stage": None})
    manager.monitor_once()
    assert sched.calls_to("restart")[0].names == (RANK(2),)


def test_another_role_lost_with_the_node_joins_the_recovery_uncounted(make_manager: ManagerFactory) -> None:
    side = {"name": "side", "entrypoint": "pkg.side:main", "is_driver": False, "recovery": "in_place"}
    manager, sched = make_manager(roles=[four_ranks(), side])
    sched.manager = manager
    sched.actors["job.side.0"].node_id = NODE
    running(manager, sched)
    sched.set(RANK(2), {"stage": None})
    sched.set("job.side.0", {"stage": None})
    manager.monitor_once()
    recoveries = [e for e in manager.state.events if e.kind in ("failover_started", "failover_joined")]
    assert [(e.kind, e.role, e.actor) for e in recoveries] == [
        ("failover_started", "train", RANK(2)),
        ("failover_joined", "side", RANK(2)),
    ]
    assert recoveries[1].tier == Tier.ROLE
    assert manager.state.roles["train"].restart_count == 1
    assert manager.state.roles["side"].restart_count == 0
