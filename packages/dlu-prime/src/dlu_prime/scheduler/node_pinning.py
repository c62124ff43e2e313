"""Where a relaunched elastic rank's own placement group is asked for: on the node its old
incarnation ran on, so the job's node layout (which ranks share a node, which node holds which
node rank) is kept; where that node has no room, for a role that kept one node rank per Ray
node, on any node but those holding its role's other node ranks, so two of its node ranks never
share a Ray node (a role that shared nodes, as on one machine, goes anywhere). Pure: the Ray side turns each
choice into a bundle label selector on Ray's node-id label (`bundle_label_selector`)."""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import replace

from dlu_prime.scheduler.placement import ActorPlan, GroupPlan

NODE_ID_LABEL = "ray.io/node-id"
"""The label Ray gives every node, its node id (hex)."""

PIN_WAIT_S = 3.0
"""How long a group pinned to the rank's old node may take to be placed before it is given up
for one placed elsewhere (a group that fits is placed well under a second)."""

Selector = dict[str, str]


def other_nodes(plans: Mapping[str, ActorPlan], nodes: Mapping[str, str], plan: ActorPlan) -> set[str]:
    """The Ray nodes holding actors of `plan`'s role with another node rank (its node mates,
    the ranks of its own node rank, are left out: they belong beside it)."""
    return {
        node
        for name, node in nodes.items()
        if name in plans and plans[name].role == plan.role and plans[name].node_rank != plan.node_rank
    }


def node_choices(home: str | None, others: Collection[str]) -> list[Selector]:
    """The selectors to try in order (an empty one: anywhere). Its old node first. Then, where
    the role kept one node rank per Ray node (its old node held no other), every node but the
    other node ranks' and nothing else: the layout stays one per node. Where it shared its
    node (one machine, a packed role), anywhere. Its node unknown: away from the others if that
    fits, else anywhere."""
    away = {NODE_ID_LABEL: f"!in({','.join(sorted(others))})"} if others else {}
    if home is None:
        return [away, {}] if away else [{}]
    if home in others:
        return [{NODE_ID_LABEL: home}, {}]
    return [{NODE_ID_LABEL: home}, away]


def selected(group: GroupPlan, selector: Selector) -> GroupPlan:
    """`group` with every bundle asked for under `selector` (none: as planned)."""
    return replace(group, labels=tuple(dict(selector) for _ in group.bundles) if selector else ())
