"""Pure placement plan: which placement groups, bundles and actors a job needs on Ray.

The Ray layer only turns this plan into calls, so every rule about bundle shapes, ranks and
resource units is decided (and unit-tested) here, without Ray.

Units are Ray's: "CPU" and "GPU" in cores/devices, "memory" in BYTES (the spec parses
"4GiB" into bytes; passing MB is a known trap), custom resources by name.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, replace
from typing import Any

from dlu_api.spec.models import JobSpec, RoleKind, RoleSpec
from dlu_api.spec.units import format_resources
from dlu_prime import naming

ISOLATION_AMOUNT = 0.001
"""How much of an isolation resource each actor (and the PrimeMaster) takes: tiny, so a node
that offers even 1 unit hosts 1000 actors; a multiple of Ray's 1e-4 granularity."""

MIN_BUNDLE_CPU = 0.001
"""CPU given to a bundle whose actors ask for nothing at all: Ray rejects all-zero bundles.
The actors still ask for 0 CPU, which fits any bundle."""

_RAY_SCALE = 10_000  # Ray stores resource amounts as fixed point with 1e-4 resolution


def ray_amount(value: float) -> float:
    """`value` on Ray's 1e-4 grid, rounded half up as Ray does.

    Actor requests and bundle sums are both built from this, so the bundle always holds exactly
    the sum of what its actors ask for (Ray rounds each number on its own; 2 x 0.00015 would
    otherwise need 0.0004 from a bundle of 0.0003).
    """
    return math.floor(value * _RAY_SCALE + 0.5) / _RAY_SCALE


@dataclass(frozen=True)
class BundlePlan:
    """One placement-group bundle: Ray resource name -> amount (memory in bytes)."""

    index: int
    resources: dict[str, float]


@dataclass(frozen=True)
class GroupPlan:
    """One placement group: a collocation, or a role of its own.

    Bundle k holds the k-th `per_group` actors of every role in `roles`. `labels`, where set,
    is one Ray label selector per bundle (the nodes it may land on; `node_pinning`).
    """

    name: str
    pg_name: str
    strategy: str
    roles: tuple[str, ...]
    bundles: tuple[BundlePlan, ...]
    labels: tuple[dict[str, str], ...] = ()


@dataclass(frozen=True)
class ActorPlan:
    """One worker actor: its Ray name, its ranks and where it sits.

    `options` are the per-actor Ray requests (`num_cpus`, `num_gpus`, `memory` in bytes when
    nonzero, `resources`); the Ray layer adds the placement-group strategy and runtime env.
    """

    name: str
    role: str
    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    node_rank: int
    group: str
    bundle_index: int
    options: dict[str, Any]


@dataclass(frozen=True)
class PlacementPlan:
    groups: tuple[GroupPlan, ...]
    actors: tuple[ActorPlan, ...]

    def actors_of(self, role: str) -> tuple[ActorPlan, ...]:
        """The role's actors in rank order (empty for an unknown role)."""
        return tuple(a for a in self.actors if a.role == role)

    def actor(self, role: str, rank: int) -> ActorPlan:
        """Raises KeyError: no such actor."""
        for actor in self.actors:
            if actor.role == role and actor.rank == rank:
                return actor
        raise KeyError(f"no actor of role {role!r} with rank {rank}")

    def group_of(self, role: str) -> GroupPlan:
        """Raises KeyError: the role is in no group."""
        for group in self.groups:
            if role in group.roles:
                return group
        raise KeyError(f"role {role!r} is in no placement group")


def _isolation(spec: JobSpec) -> dict[str, float]:
    name = spec.master.worker_isolation_resource
    return {name: ISOLATION_AMOUNT} if name else {}


def _custom(role: RoleSpec, spec: JobSpec) -> dict[str, float]:
    """Custom resources of one actor plus the worker isolation resource, zeros dropped."""
    out: dict[str, float] = {}
    for name, amount in [*sorted(role.resources.custom.items()), *_isolation(spec).items()]:
        out[name] = ray_amount(out.get(name, 0.0) + amount)
    return {name: amount for name, amount in out.items() if amount > 0}


def actor_options(role: RoleSpec, spec: JobSpec) -> dict[str, Any]:
    """Ray options of one actor of `role`: what it needs from its bundle."""
    options: dict[str, Any] = {
        "num_cpus": ray_amount(role.resources.cpu),
        "num_gpus": ray_amount(role.resources.gpu or 0.0),
    }
    if role.resources.memory > 0:
        options["memory"] = role.resources.memory
    options["resources"] = _custom(role, spec)
    return options


def bundle_resources(roles: list[RoleSpec], spec: JobSpec) -> dict[str, float]:
    """Sum over `roles` of per_group x one actor's request; zero entries dropped.

    A bundle that would be empty gets MIN_BUNDLE_CPU, because Ray rejects all-zero bundles.
    """
    total: dict[str, float] = {}

    def add(name: str, amount: float) -> None:
        total[name] = total.get(name, 0.0) + amount

    for role in roles:
        options = actor_options(role, spec)
        add("CPU", role.per_group * options["num_cpus"])
        add("GPU", role.per_group * options["num_gpus"])
        add("memory", float(role.per_group * options.get("memory", 0)))
        for name, amount in options["resources"].items():
            add(name, role.per_group * amount)
    out = {name: round(amount, 4) for name, amount in total.items() if amount > 0}
    return out or {"CPU": MIN_BUNDLE_CPU}


def _groups(spec: JobSpec) -> Iterator[tuple[str, list[RoleSpec]]]:
    """(group name, roles in spec order), groups in order of their first role in the spec.

    A collocation is named by its roles joined with '+': role names cannot hold '+', so the
    name never collides with a role's own group (as 'colloc0' could, a valid role name).
    """
    emitted: set[int] = set()
    for role in spec.roles:
        index = spec.collocation_of(role.name)
        if index is None:
            yield role.name, [role]
        elif index not in emitted:
            emitted.add(index)
            members = set(spec.collocations[index].roles)
            roles = [r for r in spec.roles if r.name in members]
            yield "+".join(r.name for r in roles), roles


def is_node_grouped(spec: JobSpec, role: RoleSpec) -> bool:
    """An elastic role with a MIN:MAX range (outside any collocation) is placed one placement
    group per node, so it can start, shrink and grow a node at a time."""
    return (
        role.kind is RoleKind.ELASTIC
        and role.elastic is not None
        and role.elastic.min_nodes < role.elastic.max_nodes
        and spec.collocation_of(role.name) is None
    )


def node_group_name(role: str, node: int) -> str:
    """The group of node `node` (0-based) of a node-grouped elastic role."""
    return f"{role}{naming.SEP}node{node}"


def _actors(spec: JobSpec, role: RoleSpec, group: str) -> Iterator[ActorPlan]:
    """Node-major ranks: bundle k holds ranks k*per_group .. (k+1)*per_group-1 (or, for a
    node-grouped role, the one bundle of node k's own group)."""
    options = actor_options(role, spec)
    per_node = is_node_grouped(spec, role)
    for rank in range(role.total):
        node_rank, local_rank = divmod(rank, role.per_group)
        yield ActorPlan(
            name=naming.actor_name(spec.name, role.name, rank),
            role=role.name,
            rank=rank,
            world_size=role.total,
            local_rank=local_rank,
            local_world_size=role.per_group,
            node_rank=node_rank,
            group=node_group_name(role.name, node_rank) if per_node else group,
            bundle_index=0 if per_node else node_rank,
            options={**options, "resources": dict(options["resources"])},
        )


def plan_placement(spec: JobSpec) -> PlacementPlan:
    """The placement groups and actors of `spec`, deterministic for a given spec.

    One group per collocation and one per other role; a group has total / per_group bundles
    (collocated roles share total and per_group, which `dlu_api.spec.rules` checks). An elastic
    role with a MIN:MAX range instead has one group of one bundle per node (`is_node_grouped`).
    Actors come in role order, then rank order.
    """
    groups: list[GroupPlan] = []
    actors: dict[str, list[ActorPlan]] = {}
    for name, roles in _groups(spec):
        resources = bundle_resources(roles, spec)
        count = roles[0].total // roles[0].per_group
        if is_node_grouped(spec, roles[0]):
            groups.extend(
                GroupPlan(
                    name=node_group_name(name, k),
                    pg_name=naming.placement_group_name(spec.name, node_group_name(name, k)),
                    strategy=str(spec.placement_strategy),
                    roles=(name,),
                    bundles=(BundlePlan(index=0, resources=dict(resources)),),
                )
                for k in range(count)
            )
            actors[name] = list(_actors(spec, roles[0], name))
            continue
        groups.append(
            GroupPlan(
                name=name,
                pg_name=naming.placement_group_name(spec.name, name),
                strategy=str(spec.placement_strategy),
                roles=tuple(r.name for r in roles),
                bundles=tuple(BundlePlan(index=k, resources=dict(resources)) for k in range(count)),
            )
        )
        for role in roles:
            actors[role.name] = list(_actors(spec, role, name))
    ordered = tuple(actor for role in spec.roles for actor in actors[role.name])
    return PlacementPlan(groups=tuple(groups), actors=ordered)


def scaled_actor(spec: JobSpec, role: str, rank: int, world_size: int) -> tuple[GroupPlan | None, ActorPlan]:
    """Where actor `rank` of a resized simple role sits. A rank of the spec keeps its bundle in
    the role's group (None: that group is the spec's); a rank beyond it gets a placement group of
    its own, one bundle for one actor, named under the job's prefix (so cleanup by prefix removes
    it, and a shrink removes exactly it)."""
    role_spec = spec.role(role)
    if rank < role_spec.total:
        return None, replace(plan_placement(spec).actor(role, rank), world_size=world_size)
    group = f"{role}{naming.SEP}{rank}"
    options = actor_options(role_spec, spec)
    wanted = {
        "CPU": options["num_cpus"],
        "GPU": options["num_gpus"],
        "memory": float(options.get("memory", 0)),
    }
    bundle = {name: amount for name, amount in {**wanted, **options["resources"]}.items() if amount > 0}
    plan = GroupPlan(
        name=group,
        pg_name=naming.placement_group_name(spec.name, group),
        strategy=str(spec.placement_strategy),
        roles=(role,),
        bundles=(BundlePlan(index=0, resources=bundle or {"CPU": MIN_BUNDLE_CPU}),),
    )
    actor = ActorPlan(
        name=naming.actor_name(spec.name, role, rank),
        role=role,
        rank=rank,
        world_size=world_size,
        local_rank=0,
        local_world_size=1,
        node_rank=rank,
        group=group,
        bundle_index=0,
        options={**options, "resources": dict(options["resources"])},
    )
    return plan, actor


def memory_actor(spec: JobSpec, plan: ActorPlan, memory: int) -> tuple[GroupPlan, ActorPlan]:
    """Actor `plan` relaunched with `memory` bytes instead of its role's: a placement group of
    its own, one bundle of its role's CPU, GPU and custom resources with the new memory (its
    role's bundle was sized for the old amount). The group's name carries the amount, so a
    group adopted by name after a PrimeMaster restart is one of the right size."""
    custom: dict[str, float] = dict(plan.options.get("resources", {}))
    options: dict[str, Any] = {**plan.options, "memory": memory, "resources": custom}
    wanted: dict[str, float] = {
        "CPU": float(options.get("num_cpus", 0.0)),
        "GPU": float(options.get("num_gpus", 0.0)),
        "memory": float(memory),
        **custom,
    }
    bundle = {name: amount for name, amount in wanted.items() if amount > 0}
    group = f"{plan.role}{naming.SEP}{plan.rank}{naming.SEP}mem{memory}"
    group_plan = GroupPlan(
        name=group,
        pg_name=naming.placement_group_name(spec.name, group),
        strategy=str(spec.placement_strategy),
        roles=(plan.role,),
        bundles=(BundlePlan(index=0, resources=bundle),),
    )
    return group_plan, replace(plan, group=group, bundle_index=0, options=options)


def master_options(spec: JobSpec) -> dict[str, Any]:
    """Ray options of the PrimeMaster actor: CPU, memory in bytes, its isolation resource."""
    master = spec.master
    options: dict[str, Any] = {"num_cpus": ray_amount(master.cpu)}
    if master.memory > 0:
        options["memory"] = master.memory
    options["resources"] = {master.isolation_resource: ISOLATION_AMOUNT} if master.isolation_resource else {}
    return options


def unplaced_message(group: GroupPlan, timeout_s: float, available: Mapping[str, float]) -> str:
    """Why a placement group is not ready: what its bundles need and what the cluster has free
    (memory in units, never a raw float of bytes)."""
    need = "; ".join(f"{{{format_resources(b.resources)}}}" for b in group.bundles)
    return (
        f"placement group {group.pg_name} (roles {', '.join(group.roles)}) could not be placed in "
        f"{timeout_s:.0f}s with strategy {group.strategy}; it needs bundles {need} and the cluster "
        f"has {format_resources(available)} available"
    )
