"""Placement plan: bundles per collocation and per role, summed resources in Ray's units
(memory in bytes), isolation resources, strategies, node-major ranks and unique names."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from dlu_api.spec import PlacementStrategy, spec_from_dict
from dlu_api.spec.models import JobSpec
from dlu_prime import naming
from dlu_prime.scheduler import (
    ISOLATION_AMOUNT,
    MIN_BUNDLE_CPU,
    PlacementPlan,
    master_options,
    plan_placement,
)
from dlu_prime.scheduler.placement import unplaced_message

GiB = 1024**3


def rl_spec(name: str = "job", **extra: Any) -> JobSpec:
    """Elastic trainer 2x4 (1 GPU each), rollout+reward collocated 4 actors in groups of 2,
    and a CPU-only evaluator."""
    data: dict[str, Any] = {
        "name": name,
        "node_num": 2,
        "device_per_node": 8,
        "roles": [
            {
                "name": "trainer",
                "kind": "elastic",
                "entrypoint": "pkg.train:main",
                "elastic": {"nnodes": "2", "nproc_per_node": 4},
                "resources": {"cpu": 2, "memory": "4GiB", "custom": {"ssd": 1}},
            },
            {
                "name": "rollout",
                "entrypoint": "pkg.rollout:Rollout",
                "total": 4,
                "per_group": 2,
                "resources": {"gpu": 0.5, "cpu": 1, "memory": "1GiB"},
                "is_driver": False,
            },
            {
                "name": "evaluator",
                "entrypoint": "pkg.eval:main",
                "is_driver": False,
                "resources": {"cpu": 0.5},
            },
            {
                "name": "reward",
                "entrypoint": "pkg.reward:Reward",
                "total": 4,
                "per_group": 2,
                "resources": {"gpu": 0.25, "cpu": 0.5, "custom": {"ssd": 0.5}},
                "is_driver": False,
            },
        ],
        "collocations": [{"roles": ["reward", "rollout"]}],
    }
    data.update(extra)
    return spec_from_dict(data)


@pytest.fixture
def plan() -> PlacementPlan:
    return plan_placement(rl_spec())


def test_one_group_per_collocation_and_per_role_in_first_appearance_order(plan: PlacementPlan) -> None:
    assert [g.name for g in plan.groups] == ["trainer", "rollout+reward", "evaluator"]
    assert [g.roles for g in plan.groups] == [("trainer",), ("rollout", "reward"), ("evaluator",)]
    assert [len(g.bundles) for g in plan.groups] == [2, 2, 1]
    assert plan.group_of("reward") is plan.group_of("rollout")
    for group in plan.groups:
        assert [b.index for b in group.bundles] == list(range(len(group.bundles)))


def test_bundle_resources_sum_per_group_times_each_role(plan: PlacementPlan) -> None:
    trainer = plan.group_of("trainer").bundles[0].resources
    assert trainer == {"CPU": 8.0, "GPU": 4.0, "memory": 4 * 4 * GiB, "ssd": 4.0}
    colloc = plan.group_of("rollout").bundles[1].resources
    # rollout 2 x (1 CPU, 0.5 GPU, 1 GiB) + reward 2 x (0.5 CPU, 0.25 GPU, 0.5 ssd)
    assert colloc == {"CPU": 3.0, "GPU": 1.5, "memory": 2 * GiB, "ssd": 1.0}
    # zero-valued entries are left out
    assert plan.group_of("evaluator").bundles[0].resources == {"CPU": 0.5}


def test_memory_is_bytes_in_bundle_and_actor_options() -> None:
    spec = spec_from_dict(
        {
            "name": "mem",
            "device_type": "CPU",
            "roles": [{"name": "w", "entrypoint": "m:f", "resources": {"memory": "4GiB"}}],
        }
    )
    plan = plan_placement(spec)
    assert plan.groups[0].bundles[0].resources["memory"] == 4294967296
    assert plan.actors[0].options["memory"] == 4294967296
    assert isinstance(plan.actors[0].options["memory"], int)


def test_a_group_that_cannot_be_placed_says_what_it_needs_in_units() -> None:
    spec = spec_from_dict(
        {
            "name": "mem",
            "device_type": "CPU",
            "roles": [{"name": "w", "entrypoint": "m:f", "total": 2, "resources": {"memory": "4GiB"}}],
        }
    )
    group = plan_placement(spec).groups[0]
    text = unplaced_message(group, 60.0, {"CPU": 3.0, "memory": 1.63174e10, "node:127.0.0.1": 1.0})
    assert text == (
        f"placement group {group.pg_name} (roles w) could not be placed in 60s with strategy PACK; it "
        "needs bundles {CPU 1, memory 4 GiB}; {CPU 1, memory 4 GiB} and the cluster has CPU 3, "
        "memory 15.2 GiB available"
    )


def test_actor_options_are_one_actors_request(plan: PlacementPlan) -> None:
    assert plan.actor("trainer", 5).options == {
        "num_cpus": 2.0,
        "num_gpus": 1.0,
        "memory": 4 * GiB,
        "resources": {"ssd": 1.0},
    }
    # memory omitted when 0, resources present even when empty
    assert plan.actor("evaluator", 0).options == {"num_cpus": 0.5, "num_gpus": 0.0, "resources": {}}


def test_bundle_holds_exactly_what_its_actors_ask(plan: PlacementPlan) -> None:
    for group in plan.groups:
        for bundle in group.bundles:
            members = [a for a in plan.actors if a.group == group.name and a.bundle_index == bundle.index]
            need: dict[str, float] = {}
            for actor in members:
                opts = actor.options
                for key, amount in [
                    ("CPU", opts["num_cpus"]),
                    ("GPU", opts["num_gpus"]),
                    ("memory", opts.get("memory", 0)),
                    *opts["resources"].items(),
                ]:
                    need[key] = need.get(key, 0) + amount
            assert {k: v for k, v in need.items() if v} == pytest.approx(bundle.resources)


def test_all_zero_bundle_gets_a_minimal_cpu() -> None:
    spec = spec_from_dict(
        {
            "name": "zero",
            "device_type": "CPU",
            "roles": [{"name": "w", "entrypoint": "m:f", "total": 2, "resources": {"cpu": 0}}],
        }
    )
    plan = plan_placement(spec)
    assert [b.resources for b in plan.groups[0].bundles] == [{"CPU": MIN_BUNDLE_CPU}] * 2
    assert plan.actors[0].options["num_cpus"] == 0


def test_fractional_amounts_stay_on_rays_grid() -> None:
    spec = spec_from_dict(
        {
            "name": "frac",
            "device_type": "CPU",
            "roles": [
                {"name": "w", "entrypoint": "m:f", "total": 3, "per_group": 3, "resources": {"cpu": 0.1}}
            ],
        }
    )
    plan = plan_placement(spec)
    assert plan.groups[0].bundles[0].resources == {"CPU": 0.3}


def test_worker_isolation_resource_per_actor_and_summed_in_bundles() -> None:
    spec = rl_spec(master={"worker_isolation_resource": "dlu_worker", "isolation_resource": "dlu_head"})
    plan = plan_placement(spec)
    for actor in plan.actors:
        assert actor.options["resources"]["dlu_worker"] == ISOLATION_AMOUNT
        assert "dlu_head" not in actor.options["resources"]
    assert plan.group_of("trainer").bundles[0].resources["dlu_worker"] == pytest.approx(4 * ISOLATION_AMOUNT)
    assert plan.group_of("rollout").bundles[0].resources["dlu_worker"] == pytest.approx(4 * ISOLATION_AMOUNT)
    assert plan.group_of("evaluator").bundles[0].resources["dlu_worker"] == pytest.approx(ISOLATION_AMOUNT)


def test_isolation_resource_alone_keeps_a_zero_bundle_valid() -> None:
    spec = spec_from_dict(
        {
            "name": "iso",
            "device_type": "CPU",
            "master": {"worker_isolation_resource": "dlu_worker"},
            "roles": [{"name": "w", "entrypoint": "m:f", "resources": {"cpu": 0}}],
        }
    )
    assert plan_placement(spec).groups[0].bundles[0].resources == {"dlu_worker": ISOLATION_AMOUNT}


def test_master_options() -> None:
    assert master_options(rl_spec()) == {"num_cpus": 1.0, "resources": {}}
    spec = rl_spec(
        master={
            "cpu": 2,
            "memory": "512MiB",
            "isolation_resource": "dlu_head",
            "worker_isolation_resource": "w",
        }
    )
    assert master_options(spec) == {
        "num_cpus": 2.0,
        "memory": 512 * 1024**2,
        "resources": {"dlu_head": ISOLATION_AMOUNT},
    }


def test_pack_is_the_default_strategy(plan: PlacementPlan) -> None:
    assert {g.strategy for g in plan.groups} == {"PACK"}


@pytest.mark.parametrize("strategy", list(PlacementStrategy))
def test_strategy_comes_from_the_spec(strategy: PlacementStrategy) -> None:
    plan = plan_placement(rl_spec(placement_strategy=strategy.value))
    assert {g.strategy for g in plan.groups} == {strategy.value}


def test_ranks_are_node_major(plan: PlacementPlan) -> None:
    trainers = plan.actors_of("trainer")
    assert [a.rank for a in trainers] == list(range(8))
    assert [(a.node_rank, a.local_rank) for a in trainers] == [(k, r) for k in range(2) for r in range(4)]
    for actor in plan.actors:
        assert actor.bundle_index == actor.node_rank == actor.rank // actor.local_world_size
        assert actor.local_rank == actor.rank % actor.local_world_size
        assert actor.group == plan.group_of(actor.role).name
    assert {(a.world_size, a.local_world_size) for a in trainers} == {(8, 4)}
    rollout = plan.actors_of("rollout")
    assert [(a.rank, a.bundle_index, a.local_rank) for a in rollout] == [
        (0, 0, 0),
        (1, 0, 1),
        (2, 1, 0),
        (3, 1, 1),
    ]


def test_actors_in_role_order_then_rank(plan: PlacementPlan) -> None:
    order = [(a.role, a.rank) for a in plan.actors]
    roles = ["trainer", "rollout", "evaluator", "reward"]
    totals = {"trainer": 8, "rollout": 4, "evaluator": 1, "reward": 4}
    assert order == [(role, rank) for role in roles for rank in range(totals[role])]


def test_names_come_from_naming(plan: PlacementPlan) -> None:
    assert plan.actor("reward", 3).name == naming.actor_name("job", "reward", 3)
    assert plan.group_of("reward").pg_name == naming.placement_group_name("job", "rollout+reward")
    assert all(a.name.startswith(naming.job_prefix("job")) for a in plan.actors)


def test_names_unique_within_and_across_jobs() -> None:
    one, two = plan_placement(rl_spec("job-a")), plan_placement(rl_spec("job-b"))
    names_one = [a.name for a in one.actors] + [g.pg_name for g in one.groups]
    names_two = [a.name for a in two.actors] + [g.pg_name for g in two.groups]
    assert len(set(names_one)) == len(names_one)
    assert not set(names_one) & set(names_two)


def test_collocation_name_cannot_collide_with_a_role_named_like_it() -> None:
    spec = spec_from_dict(
        {
            "name": "clash",
            "device_type": "CPU",
            "roles": [
                {"name": "colloc0", "entrypoint": "m:f"},
                {"name": "a", "entrypoint": "m:f", "is_driver": False},
                {"name": "b", "entrypoint": "m:f", "is_driver": False},
            ],
            "collocations": [{"roles": ["a", "b"]}],
        }
    )
    pg_names = [g.pg_name for g in plan_placement(spec).groups]
    assert len(set(pg_names)) == len(pg_names) == 2


def test_plan_is_deterministic() -> None:
    assert plan_placement(rl_spec()) == plan_placement(rl_spec())
    assert repr(plan_placement(rl_spec())) == repr(plan_placement(rl_spec()))


def test_actor_options_are_not_shared_between_actors(plan: PlacementPlan) -> None:
    first, second = plan.actors_of("trainer")[:2]
    assert first.options == second.options
    assert first.options is not second.options
    assert first.options["resources"] is not second.options["resources"]


def test_lookups_of_unknown_roles() -> None:
    plan = plan_placement(rl_spec())
    assert plan.actors_of("nope") == ()
    with pytest.raises(KeyError):
        plan.group_of("nope")
    with pytest.raises(KeyError):
        plan.actor("trainer", 99)


def test_a_rank_a_resize_adds_beyond_the_spec_gets_a_group_of_its_own() -> None:
    from dlu_prime.scheduler.placement import scaled_actor

    spec = rl_spec(placement_strategy="SPREAD")
    group, actor = scaled_actor(spec, "evaluator", 3, world_size=4)
    assert group is not None
    assert (group.name, group.pg_name, group.strategy) == ("evaluator.3", "job.pg.evaluator.3", "SPREAD")
    assert group.pg_name.startswith(naming.job_prefix("job"))  # removed by the job's cleanup
    assert [b.resources for b in group.bundles] == [{"CPU": 0.5}]  # exactly one actor's request
    assert (actor.name, actor.group, actor.bundle_index, actor.world_size) == (
        "job.evaluator.3",
        "evaluator.3",
        0,
        4,
    )
    assert (actor.local_rank, actor.local_world_size, actor.node_rank) == (0, 1, 3)


def test_a_rank_of_the_spec_keeps_its_bundle_with_the_new_world_size() -> None:
    from dlu_prime.scheduler.placement import scaled_actor

    spec = rl_spec()
    group, actor = scaled_actor(spec, "evaluator", 0, world_size=3)
    assert group is None
    assert actor == replace(plan_placement(spec).actor("evaluator", 0), world_size=3)
