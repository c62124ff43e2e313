"""Where a relaunched elastic rank's own group is asked for (`node_pinning`, pure): its old node
first, then, where the role kept one node rank per node, anywhere but its other node ranks'."""

from __future__ import annotations

from dataclasses import replace

from dlu_prime.scheduler.node_pinning import NODE_ID_LABEL, node_choices, other_nodes, selected
from dlu_prime.scheduler.placement import ActorPlan, BundlePlan, GroupPlan


def _plan(name: str, role: str, node_rank: int) -> ActorPlan:
    return ActorPlan(name, role, node_rank, 4, 0, 1, node_rank, f"{role}.node{node_rank}", 0, {})


def test_the_old_node_first_then_anywhere_but_the_roles_other_node_ranks() -> None:
    assert node_choices("n1", {"n0", "n2"}) == [{NODE_ID_LABEL: "n1"}, {NODE_ID_LABEL: "!in(n0,n2)"}]
    assert node_choices("n1", ()) == [{NODE_ID_LABEL: "n1"}, {}]  # a role of one node rank


def test_a_role_that_shared_its_node_may_go_anywhere_and_an_unknown_node_tries_away_first() -> None:
    assert node_choices("n0", {"n0"}) == [{NODE_ID_LABEL: "n0"}, {}]  # one machine: every rank on n0
    assert node_choices(None, {"n0"}) == [{NODE_ID_LABEL: "!in(n0)"}, {}]
    assert node_choices(None, ()) == [{}]


def test_other_node_ranks_of_the_role_only_its_node_mates_and_other_roles_left_out() -> None:
    plans = {
        "t.0": _plan("t.0", "t", 0),
        "t.1": _plan("t.1", "t", 1),
        "t.1b": _plan("t.1b", "t", 1),  # a node mate of t.1 (same node rank)
        "p.0": _plan("p.0", "p", 0),
    }
    nodes = {"t.0": "n0", "t.1": "n1", "t.1b": "n1", "p.0": "n2", "gone": "n3"}
    assert other_nodes(plans, nodes, plans["t.1"]) == {"n0"}


def test_a_selector_applies_to_every_bundle_and_none_leaves_the_group_as_planned() -> None:
    group = GroupPlan(
        "g", "j.pg.g", "PACK", ("t",), (BundlePlan(0, {"CPU": 1.0}), BundlePlan(1, {"CPU": 1.0}))
    )
    assert selected(group, {NODE_ID_LABEL: "n1"}).labels == ({NODE_ID_LABEL: "n1"},) * 2
    assert selected(group, {}) == group == replace(group, labels=())
