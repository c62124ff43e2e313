"""Placement of elastic roles with a MIN:MAX range: one placement group per node.

A role asks Ray for each of its MAX nodes separately, so it can start with the nodes Ray can
place (at least MIN) and take the others when they become placeable: a group that is not placed
stays asked for (Ray places it when capacity appears). `start_verdict` is the pure rule for the
start; `NodeGroups` does the Ray calls.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from dlu_api.spec.models import JobSpec, RoleSpec
from dlu_api.spec.units import format_resources
from dlu_prime.scheduler.placement import GroupPlan, PlacementPlan, is_node_grouped, node_group_name

POLL_S = 0.1
# How long nodes may take to be placed before the wait for them is said (placing takes well
# under a second when they fit).
WAIT_SAID_S = 2.0


class StartKind(StrEnum):
    WAIT = "wait"
    START = "start"
    FAIL = "fail"


@dataclass(frozen=True)
class StartVerdict:
    kind: StartKind
    nodes: tuple[int, ...] = ()
    reason: str = ""


def start_verdict(
    role: str, placed: Sequence[int], min_nodes: int, max_nodes: int, elapsed_s: float, timeout_s: float
) -> StartVerdict:
    """Start at once with MAX nodes; at the timeout start with what is placed if that is at
    least MIN, else fail; before it, wait (below MIN too: capacity may still come)."""
    nodes = tuple(sorted(placed))
    if len(nodes) >= max_nodes:
        return StartVerdict(StartKind.START, nodes[:max_nodes])
    if elapsed_s < timeout_s:
        return StartVerdict(StartKind.WAIT, nodes)
    if len(nodes) >= min_nodes:
        return StartVerdict(StartKind.START, nodes)
    return StartVerdict(
        StartKind.FAIL,
        nodes,
        f"role {role} got {len(nodes)} node(s) placed in {timeout_s:g}s (elastic.start_timeout_s) but "
        f"needs at least {min_nodes} (nnodes {min_nodes}:{max_nodes})",
    )


def missing_message(group: GroupPlan, available: Mapping[str, float]) -> str:
    """What one more node of the role needs, against what the cluster has free (leaving out
    the resources Ray makes of placed bundles, `bundle_group_...`, `CPU_group_...`: only their
    placement group can use them)."""
    need = format_resources(group.bundles[0].resources)
    free = {name: amount for name, amount in available.items() if "_group_" not in name}
    return f"each node of the role needs {{{need}}} and the cluster has {format_resources(free)} available"


def node_ranks(role: RoleSpec, node: int) -> list[int]:
    """The ranks of node `node` of an elastic role (node-major)."""
    return list(range(node * role.per_group, (node + 1) * role.per_group))


class NodeGroups:
    """The per-node placement groups of a job's node-grouped elastic roles.

    `group` is the scheduler's create-or-adopt of a placement group by group name, so names and
    lifetimes stay those of every other group of the job.
    """

    def __init__(self, spec: JobSpec, plan: PlacementPlan, group: Callable[[str], Any]) -> None:
        self.spec = spec
        self._plan = plan
        self._group = group
        self.roles = [r for r in spec.roles if is_node_grouped(spec, r)]
        # Told, once per role, what `wait_start` waits for when it waits past WAIT_SAID_S (the
        # PrimeMaster puts it on the timeline): a wait for nodes is never silent.
        self.on_wait: Callable[[str], None] | None = None

    def names(self) -> set[str]:
        """Every node group's name (the groups the ordinary wait must skip)."""
        return {node_group_name(r.name, k) for r in self.roles for k in range(r.total // r.per_group)}

    def _plan_of(self, name: str) -> GroupPlan:
        return next(g for g in self._plan.groups if g.name == name)

    def placed(self, role: str, nodes: Sequence[int], wait_s: float = 0.0) -> list[int]:
        """Which of these nodes of `role` have their group placed (asking Ray for any not yet
        asked for), waiting up to `wait_s` for all of them. Read from Ray's placement group
        table: a group a lost node held is pending again there, as Ray reschedules it."""
        from ray.util import placement_group_table

        groups = {k: self._group(node_group_name(role, k)) for k in nodes}
        deadline = time.monotonic() + wait_s
        while True:
            done = sorted(
                k for k, pg in groups.items() if placement_group_table(pg).get("state") == "CREATED"
            )
            if len(done) == len(groups) or time.monotonic() >= deadline:
                return done
            time.sleep(POLL_S)

    def wait_start(self) -> tuple[dict[str, list[int]], str | None]:
        """Wait for each node-grouped role's nodes as `start_verdict` says; role -> the nodes to
        start with, or the reason no start is possible."""
        import ray

        started = time.monotonic()
        out: dict[str, list[int]] = {}
        pending = list(self.roles)
        said: set[str] = set()
        while pending:
            elapsed = time.monotonic() - started
            for role in list(pending):
                assert role.elastic is not None
                count = role.total // role.per_group
                placed = self.placed(role.name, range(count))
                timeout = role.elastic.start_timeout_s
                verdict = start_verdict(role.name, placed, role.elastic.min_nodes, count, elapsed, timeout)
                if verdict.kind is StartKind.FAIL:
                    missing = self._plan_of(node_group_name(role.name, 0))
                    return out, f"{verdict.reason}; {missing_message(missing, ray.available_resources())}"
                if verdict.kind is StartKind.START:
                    out[role.name] = list(verdict.nodes)
                    pending.remove(role)
                elif elapsed >= WAIT_SAID_S and role.name not in said and self.on_wait is not None:
                    said.add(role.name)
                    self.on_wait(
                        f"role {role.name}: {len(placed)} of {count} node(s) placed; waiting up to "
                        f"{timeout:g}s (elastic.start_timeout_s) for the rest, then starting with at "
                        f"least {role.elastic.min_nodes}; {self.needs(role.name)}"
                    )
            if pending:
                time.sleep(POLL_S)
        return out, None

    def needs(self, role: str) -> str:
        """What one node of `role` needs, against what the cluster has free now."""
        import ray

        return missing_message(self._plan_of(node_group_name(role, 0)), ray.available_resources())

    def not_started(self, starts: Mapping[str, Sequence[int]]) -> set[str]:
        """Actors of the nodes a role does not start with (`wait_start`'s answer)."""
        return {
            a.name
            for role in self.roles
            for a in self._plan.actors_of(role.name)
            if a.node_rank not in starts.get(role.name, ())
        }

    def remove(self, role: str, nodes: Sequence[int]) -> None:
        """Give these nodes' groups back (the role was scaled down by hand)."""
        from dlu_prime.scheduler.cleanup import remove_group

        for k in nodes:
            remove_group(self._plan_of(node_group_name(role, k)).pg_name)
