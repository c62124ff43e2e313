"""Cross-field rules: every rule names the field at fault and gives a fix."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest

from dlu_api.errors import Problem, SpecError
from dlu_api.spec import autoscale_rules, rules
from dlu_api.spec.io import spec_from_dict
from dlu_api.spec.models import JobSpec
from dlu_api.spec.rules import RULES, check_spec, ensure_valid

Data = dict[str, Any]
Mutation = Callable[[Data], None]


def base() -> Data:
    """A valid GPU job on 2 nodes x 8 GPUs asking for 12 GPUs; `evaluator` is a free-standing
    CPU role that most cases bend."""
    return {
        "name": "job",
        "node_num": 2,
        "device_per_node": 8,
        "env": {"GLOBAL": "1"},
        "roles": [
            {
                "name": "trainer",
                "kind": "elastic",
                "entrypoint": "pkg.train:main",
                "elastic": {"nnodes": "2", "nproc_per_node": 4},
                "resources": {"memory": "4GiB"},
            },
            {
                "name": "rollout",
                "entrypoint": "pkg.rollout:Rollout",
                "total": 4,
                "per_group": 2,
                "resources": {"gpu": 0.5},
                "is_driver": False,
            },
            {
                "name": "reward",
                "entrypoint": "-m pkg.reward",
                "total": 4,
                "per_group": 2,
                "resources": {"gpu": 0.5},
                "is_driver": False,
            },
            {
                "name": "evaluator",
                "entrypoint": "eval.py --fast",
                "is_driver": False,
                "env": {"EVAL": "yes"},
            },
        ],
        "collocations": [{"roles": ["rollout", "reward"]}],
    }


def _merge(target: Data, fields: Data) -> None:
    for key, value in fields.items():
        if isinstance(value, dict) and isinstance(target.get(key), dict):
            _merge(target[key], value)  # pyright: ignore[reportUnknownArgumentType]
        else:
            target[key] = value


def job(**fields: Any) -> Mutation:
    """Set job-level fields; dicts merge into what is there."""
    return lambda data: _merge(data, fields)


def on(role_name: str, /, **fields: Any) -> Mutation:
    """Set fields of the role called `role_name`; dicts merge into what is there."""
    return lambda data: _merge(next(r for r in data["roles"] if r["name"] == role_name), fields)


def drop(name: str, *keys: str) -> Mutation:
    def apply(data: Data) -> None:
        target = next(r for r in data["roles"] if r["name"] == name)
        for key in keys:
            target.pop(key, None)

    return apply


def cpu_job(data: Data) -> None:
    """Make the base job a CPU job without GPU asks."""
    data["device_type"] = "CPU"
    for r in data["roles"]:
        r.setdefault("resources", {})["gpu"] = 0


def build(*mutations: Mutation) -> JobSpec:
    data = copy.deepcopy(base())
    for mutate in mutations:
        mutate(data)
    return spec_from_dict(data, validate=False)


def fields(problems: list[Problem]) -> list[str]:
    return sorted(p.field for p in problems)


# Each case: id, the rule that must fire, the field it must name, the mutations, and the
# complete (sorted) list of fields that check_spec reports, so no other rule misfires.
CASES: list[tuple[str, Callable[..., Any], str, list[Mutation], list[str]]] = [
    (
        "duplicate-role-name",
        rules.unique_role_names,
        "roles[rollout]",
        [on("reward", name="rollout"), job(collocations=[])],
        ["roles[rollout]"],
    ),
    (
        "actors-past-the-bound-together",
        rules.actors_are_bounded,
        "roles",
        [cpu_job, on("rollout", total=6000), on("reward", total=6000)],
        ["roles"],
    ),
    ("node-num-zero", rules.positive_counts, "node_num", [job(node_num=0)], ["node_num", "roles"]),
    (
        "device-per-node-zero-gpu",
        rules.positive_counts,
        "device_per_node",
        [job(device_per_node=0)],
        ["collocations[0]", "device_per_node", "roles", "roles[trainer].per_group"],
    ),
    (
        "device-per-node-negative-cpu",
        rules.positive_counts,
        "device_per_node",
        [cpu_job, job(device_per_node=-1)],
        ["device_per_node"],
    ),
    (
        "total-zero",
        rules.positive_counts,
        "roles[evaluator].total",
        [on("evaluator", total=0)],
        ["roles[evaluator].total"],
    ),
    (
        "total-negative",
        rules.positive_counts,
        "roles[evaluator].total",
        [on("evaluator", total=-2)],
        ["roles[evaluator].total"],
    ),
    (
        "per-group-zero",
        rules.positive_counts,
        "roles[evaluator].per_group",
        [on("evaluator", per_group=0)],
        ["roles[evaluator].per_group"],
    ),
    (
        "max-restart-negative",
        rules.positive_counts,
        "roles[evaluator].max_restart",
        [on("evaluator", max_restart=-1)],
        ["roles[evaluator].max_restart"],
    ),
    (
        "per-node-max-failure-zero",
        rules.positive_counts,
        "roles[evaluator].per_node_max_failure",
        [on("evaluator", per_node_max_failure=0)],
        ["roles[evaluator].per_node_max_failure"],
    ),
    (
        "escalate-after-zero",
        rules.positive_counts,
        "roles[evaluator].escalate_after",
        [on("evaluator", escalate_after=0)],
        ["roles[evaluator].escalate_after"],
    ),
    (
        "total-not-multiple-of-per-group",
        rules.positive_counts,
        "roles[evaluator].total",
        [on("evaluator", total=3, per_group=2)],
        ["roles[evaluator].total"],
    ),
    (
        "unknown-role-in-collocation",
        rules.collocations_name_known_roles,
        "collocations[0].roles",
        [job(collocations=[{"roles": ["rollout", "reward", "ghost"]}])],
        ["collocations[0].roles"],
    ),
    (
        "role-in-two-collocations",
        rules.collocations_name_known_roles,
        "collocations[1].roles",
        [
            on("evaluator", total=4, per_group=2),
            job(collocations=[{"roles": ["rollout", "reward"]}, {"roles": ["reward", "evaluator"]}]),
        ],
        ["collocations[1].roles"],
    ),
    (
        "collocated-shapes-differ",
        rules.collocations_name_known_roles,
        "collocations[0]",
        [on("rollout", total=6)],
        ["collocations[0]"],
    ),
    (
        "gpu-demand-above-cluster",
        rules.gpu_demand_fits,
        "roles",
        [job(node_num=1)],
        ["roles"],
    ),
    (
        "bundle-bigger-than-node",
        rules.gpu_demand_fits,
        "roles[evaluator].per_group",
        [job(node_num=4), on("evaluator", total=2, per_group=2, resources={"gpu": 5})],
        ["roles[evaluator].per_group"],
    ),
    (
        "collocated-bundle-bigger-than-node",
        rules.gpu_demand_fits,
        "collocations[0]",
        [job(node_num=4), on("rollout", resources={"gpu": 3}), on("reward", resources={"gpu": 3})],
        ["collocations[0]"],
    ),
    (
        "gpu-in-cpu-job",
        rules.gpu_demand_fits,
        "roles[reward].resources.gpu",
        [job(device_type="CPU"), on("rollout", resources={"gpu": 0})],
        ["roles[reward].resources.gpu"],
    ),
    (
        "explicit-gpu-on-elastic-role-in-cpu-job",
        rules.gpu_demand_fits,
        "roles[trainer].resources.gpu",
        [cpu_job, on("trainer", resources={"gpu": 1})],
        ["roles[trainer].resources.gpu"],
    ),
    (
        "rank-based-selection-with-per-group-one",
        rules.gpu_selection_is_sound,
        "roles[evaluator].rank_based_gpu_selection",
        [on("evaluator", rank_based_gpu_selection=True, resources={"gpu": 1})],
        ["roles[evaluator].rank_based_gpu_selection"],
    ),
    (
        "rank-based-selection-with-gpu-above-one",
        rules.gpu_selection_is_sound,
        "roles[evaluator].rank_based_gpu_selection",
        [on("evaluator", total=2, per_group=2, rank_based_gpu_selection=True, resources={"gpu": 2})],
        ["roles[evaluator].rank_based_gpu_selection"],
    ),
    (
        "shared-gpu-without-rank-based-selection",
        rules.gpu_selection_is_sound,
        "roles[evaluator].resources.gpu",
        [on("evaluator", total=8, per_group=8, resources={"gpu": 0.5})],
        ["roles[evaluator].resources.gpu"],
    ),
    (
        "elastic-total-mismatch",
        rules.elastic_roles_are_consistent,
        "roles[trainer].total",
        [on("trainer", total=4)],
        ["roles[trainer].total"],
    ),
    (
        "elastic-per-group-mismatch",
        rules.elastic_roles_are_consistent,
        "roles[trainer].per_group",
        [on("trainer", per_group=2)],
        ["roles[trainer].per_group"],
    ),
    (
        "elastic-settings-on-simple-role",
        rules.elastic_roles_are_consistent,
        "roles[evaluator].elastic",
        [on("evaluator", elastic={"nnodes": "1"})],
        ["roles[evaluator].elastic"],
    ),
    (
        "entrypoint-syntax",
        rules.entrypoints_parse,
        "roles[evaluator].entrypoint",
        [on("evaluator", entrypoint="x y")],
        ["roles[evaluator].entrypoint"],
    ),
    (
        "torchrun-in-simple-role",
        rules.entrypoints_parse,
        "roles[evaluator].entrypoint",
        [on("evaluator", entrypoint="torchrun eval.py")],
        ["roles[evaluator].entrypoint"],
    ),
    (
        "torchrun-unknown-flag",
        rules.entrypoints_parse,
        "roles[trainer].entrypoint",
        [on("trainer", entrypoint="torchrun --bogus train.py")],
        ["roles[trainer].entrypoint"],
    ),
    (
        "torchrun-nnodes-disagrees",
        rules.entrypoints_parse,
        "roles[trainer].elastic.nnodes",
        [on("trainer", entrypoint="torchrun --nnodes=1 --nproc-per-node=4 train.py")],
        ["roles[trainer].elastic.nnodes"],
    ),
    (
        "torchrun-nproc-disagrees",
        rules.entrypoints_parse,
        "roles[trainer].elastic.nproc_per_node",
        [on("trainer", entrypoint="torchrun --nnodes=2 --nproc-per-node=2 train.py")],
        ["roles[trainer].elastic.nproc_per_node"],
    ),
    (
        "torchrun-nproc-gpu-not-device-per-node",
        rules.entrypoints_parse,
        "roles[trainer].elastic.nproc_per_node",
        [
            on("trainer", entrypoint="torchrun --nnodes=2 --nproc-per-node=gpu train.py"),
            drop("trainer", "elastic"),
        ],
        ["roles[trainer].elastic.nproc_per_node"],
    ),
    (
        "torchrun-nproc-cpu",
        rules.entrypoints_parse,
        "roles[trainer].entrypoint",
        [on("trainer", entrypoint="torchrun --nnodes=2 --nproc-per-node=cpu train.py")],
        ["roles[trainer].entrypoint"],
    ),
    (
        "custom-role-without-sub-master",
        rules.entrypoints_parse,
        "roles[evaluator].sub_master",
        [on("evaluator", kind="custom")],
        ["roles[evaluator].sub_master"],
    ),
    (
        "custom-role-with-bad-sub-master",
        rules.entrypoints_parse,
        "roles[evaluator].sub_master",
        [on("evaluator", kind="custom", sub_master="not a class")],
        ["roles[evaluator].sub_master"],
    ),
    (
        "sub-master-on-simple-role",
        rules.entrypoints_parse,
        "roles[evaluator].sub_master",
        [on("evaluator", sub_master="pkg.sub:MySubMaster")],
        ["roles[evaluator].sub_master"],
    ),
    (
        "role-memory-looks-like-mb",
        rules.memory_in_bytes,
        "roles[evaluator].resources.memory",
        [on("evaluator", resources={"memory": 4096})],
        ["roles[evaluator].resources.memory"],
    ),
    (
        "master-memory-looks-like-gb",
        rules.memory_in_bytes,
        "master.memory",
        [job(master={"memory": 16})],
        ["master.memory"],
    ),
    (
        "no-driver-role",
        rules.job_has_a_driver,
        "roles",
        [on("trainer", is_driver=False)],
        ["roles"],
    ),
    (
        "empty-global-env-name",
        rules.env_names_are_valid,
        "env",
        [job(env={"": "x"})],
        ["env"],
    ),
    (
        "role-env-name-with-equals",
        rules.env_names_are_valid,
        "roles[evaluator].env",
        [on("evaluator", env={"A=B": "1"})],
        ["roles[evaluator].env"],
    ),
    (
        "role-env-name-with-nul",
        rules.env_names_are_valid,
        "roles[rollout].env",
        [on("rollout", env={"A\0B": "1"})],
        ["roles[rollout].env"],
    ),
    (
        "heartbeat-timeout-equals-interval",
        rules.health_is_sound,
        "health.heartbeat_timeout_s",
        [job(health={"heartbeat_interval_s": 5, "heartbeat_timeout_s": 5})],
        ["health.heartbeat_timeout_s"],
    ),
    (
        "heartbeat-timeout-below-interval",
        rules.health_is_sound,
        "health.heartbeat_timeout_s",
        [job(health={"heartbeat_interval_s": 10, "heartbeat_timeout_s": 3})],
        ["health.heartbeat_timeout_s"],
    ),
    (
        "autoscale-backlog-role-not-simple",
        autoscale_rules.autoscale_is_sound,
        "autoscale.backlog_roles.trainer",
        [job(autoscale={"mode": "single-job", "backlog_roles": {"trainer": "samples"}})],
        ["autoscale.backlog_roles.trainer"],
    ),
]


@pytest.mark.parametrize(
    ("rule", "field", "mutations", "expected"),
    [case[1:] for case in CASES],
    ids=[case[0] for case in CASES],
)
def test_rule_names_field_and_fix(
    rule: Callable[[JobSpec], Any], field: str, mutations: list[Mutation], expected: list[str]
) -> None:
    spec = build(*mutations)
    mine = list(rule(spec))
    assert field in fields(mine), f"{rule.__name__} did not report {field}: {mine}"
    problems = check_spec(spec)
    assert fields(problems) == expected, [str(p) for p in problems]
    for problem in problems:
        assert problem.message.strip()
        assert problem.fix.strip()
        assert str(problem).startswith(f"{problem.field}: ")


def test_every_rule_has_a_bad_case() -> None:
    covered = {case[1] for case in CASES}
    missing = [r.__name__ for r in RULES if r not in covered]
    assert not missing


def test_base_spec_has_no_problems() -> None:
    spec = build()
    assert check_spec(spec) == []
    assert ensure_valid(spec) is spec
    assert spec_from_dict(base()) == spec


@pytest.mark.parametrize(
    "mutations",
    [
        pytest.param([on("evaluator", max_restart=0)], id="max-restart-zero"),
        pytest.param([cpu_job, job(device_per_node=0)], id="cpu-job-without-devices"),
        pytest.param(
            [on("evaluator", total=8, per_group=8, rank_based_gpu_selection=True, resources={"gpu": 0.5})],
            id="shared-gpu-with-rank-based-selection",
        ),
        pytest.param(
            [job(node_num=3), on("evaluator", total=8, per_group=8, resources={"gpu": 0.6})],
            id="gpu-above-half-per-group-8",
        ),
        pytest.param(
            [on("evaluator", total=2, per_group=2, rank_based_gpu_selection=True, resources={"gpu": 1})],
            id="rank-based-selection-one-gpu",
        ),
        pytest.param(
            [on("trainer", entrypoint="torchrun --nnodes=2 --nproc-per-node=4 train.py --x 1")],
            id="torchrun-agrees",
        ),
        pytest.param(
            [
                on(
                    "trainer",
                    entrypoint="torchrun --nnodes=2 --nproc-per-node=4 t.py",
                    elastic={"nnodes": "2:2"},
                )
            ],
            id="torchrun-nnodes-same-range-other-spelling",
        ),
        pytest.param(
            [
                on("trainer", entrypoint="torchrun --nnodes=2 --nproc-per-node=4 train.py"),
                drop("trainer", "elastic"),
            ],
            id="torchrun-fills-elastic",
        ),
        pytest.param(
            [
                job(device_per_node=4, node_num=4),
                on("trainer", entrypoint="torchrun --nnodes=2 --nproc-per-node=gpu train.py"),
            ],
            id="torchrun-nproc-gpu-matches-device-per-node",
        ),
        pytest.param([on("evaluator", kind="custom", sub_master="pkg.sub:MySubMaster")], id="custom-role"),
        pytest.param([on("evaluator", resources={"memory": "1MiB"})], id="memory-one-mib"),
        pytest.param([job(node_num=1, device_per_node=16)], id="demand-equals-capacity"),
    ],
)
def test_good_variants_have_no_problems(mutations: list[Mutation]) -> None:
    spec = build(*mutations)
    assert check_spec(spec) == [], [str(p) for p in check_spec(spec)]


def test_total_not_multiple_fix_suggests_a_multiple() -> None:
    [problem] = check_spec(build(on("evaluator", total=5, per_group=2)))
    assert "per_group=2" in problem.message
    assert "e.g. 4" in problem.fix


def test_memory_fix_names_the_unit() -> None:
    [problem] = check_spec(build(on("evaluator", resources={"memory": 4096})))
    assert "4096MiB" in problem.fix
    assert "(4 GiB)" in problem.fix


def test_unknown_collocated_role_fix_lists_roles() -> None:
    [problem] = check_spec(build(job(collocations=[{"roles": ["rollout", "ghost"]}])))
    assert "'ghost'" in problem.message
    assert "evaluator, reward, rollout, trainer" in problem.fix


def test_all_problems_are_reported_at_once() -> None:
    data = base()
    data["node_num"] = 0
    data["health"] = {"heartbeat_interval_s": 10, "heartbeat_timeout_s": 10}
    data["collocations"] = [{"roles": ["rollout", "ghost"]}]
    evaluator = data["roles"][3]
    evaluator.update(entrypoint="x y", env={"": "1"}, resources={"memory": 512})
    data["roles"][0]["is_driver"] = False

    with pytest.raises(SpecError) as info:
        spec_from_dict(data)
    got = fields(info.value.problems)
    for field in (
        "node_num",
        "collocations[0].roles",
        "roles",
        "roles[evaluator].entrypoint",
        "roles[evaluator].resources.memory",
        "roles[evaluator].env",
        "health.heartbeat_timeout_s",
    ):
        assert field in got
    assert got.count("roles") == 2  # GPU demand above a zero-node cluster, and no driver
    assert len(info.value.problems) >= 8
    text = str(info.value)
    assert f"({len(info.value.problems)} problem(s))" in text
    assert all(str(p) in text for p in info.value.problems)


def test_ensure_valid_raises_with_the_check_spec_problems() -> None:
    spec = build(on("evaluator", total=0), job(node_num=1))
    with pytest.raises(SpecError) as info:
        ensure_valid(spec)
    assert info.value.problems == check_spec(spec)
    assert fields(info.value.problems) == ["roles", "roles[evaluator].total"]


@pytest.mark.parametrize(
    ("mutations", "needle"),
    [
        (
            [on("trainer", entrypoint="run this please")],
            "write roles[trainer].entrypoint in one of the forms",
        ),
        (
            [on("trainer", entrypoint="torchrun --bogus train.py")],
            "fix the torchrun command in roles[trainer]",
        ),
        ([on("evaluator", env={"A=B": "1"})], "rename it in roles[evaluator].env to a name without '='"),
        (
            [job(health={"heartbeat_interval_s": 10, "heartbeat_timeout_s": 3})],
            "heartbeat_timeout_s to several",
        ),
    ],
)
def test_fixes_name_the_field_and_an_example(mutations: list[Mutation], needle: str) -> None:
    [problem] = check_spec(build(*mutations))
    assert needle in problem.fix
    assert "e.g." in problem.fix
