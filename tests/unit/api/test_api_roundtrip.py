"""YAML/JSON round trips, spec files versus builders, and load errors as Problems."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path
from typing import Any

import pytest
import yaml

from dlu_api.builder import DLJobBuilder, RLJobBuilder
from dlu_api.errors import SpecError
from dlu_api.spec.io import dump_spec, load_spec, load_spec_text, spec_from_dict, spec_to_dict
from dlu_api.spec.models import (
    CommBackend,
    DeviceType,
    JobSpec,
    PlacementStrategy,
    RecoveryPolicy,
    RoleKind,
)

GiB = 2**30


def rich_spec() -> JobSpec:
    """Every section set to something other than its default."""
    return spec_from_dict(
        {
            "name": "rich-job-1",
            "config": {
                "lr": 0.001,
                "layers": [1, 2, {"deep": [True, None, "x"]}],
                "nested": {"a": {"b": {"c": "yes"}}, "on": "off", "num_str": "1.0"},
                "empty": {},
            },
            "env": {"GLOBAL_FLAG": "1", "QUOTED": "a: b # c"},
            "node_num": 3,
            "device_per_node": 4,
            "device_type": "GPU",
            "placement_strategy": "SPREAD",
            "roles": [
                {
                    "name": "trainer",
                    "kind": "elastic",
                    "entrypoint": "train.py --lr 1e-3 --name 'a b'",
                    "resources": {"cpu": 4, "memory": "16GiB", "custom": {"ib": 1.0}},
                    "env": {"NCCL_DEBUG": "INFO"},
                    "max_restart": 2,
                    "per_node_max_failure": 1,
                    "recovery": "global",
                    "escalate_after": 2,
                    "elastic": {
                        "nnodes": "1:2",
                        "nproc_per_node": 2,
                        "comm_backend": "nccl",
                        "setup_process_group": False,
                        "rendezvous_grace_s": 12.5,
                        "agent_store": False,
                        "node_check": {
                            "enabled": True,
                            "timeout_s": 60,
                            "straggler_ratio": 3.0,
                            "exclude_stragglers": True,
                            "matmul_size": 256,
                            "allreduce_mb": 4,
                        },
                    },
                },
                {
                    "name": "rollout",
                    "entrypoint": "pkg.rollout:Rollout",
                    "total": 4,
                    "per_group": 2,
                    "resources": {"gpu": 0.5, "memory": 2 * GiB},
                    "is_driver": False,
                    "rank_based_gpu_selection": True,
                },
                {
                    "name": "reward",
                    "entrypoint": "-m pkg.reward --port 0",
                    "total": 4,
                    "per_group": 2,
                    "resources": {"gpu": 0.5},
                    "is_driver": False,
                    "rank_based_gpu_selection": True,
                },
                {
                    "name": "coordinator",
                    "kind": "custom",
                    "entrypoint": "pkg.coord.main",
                    "sub_master": "pkg.coord:CoordSubMaster",
                    "is_driver": False,
                },
            ],
            "collocations": [{"roles": ["rollout", "reward"]}],
            "state_store": {
                "name": "redis",
                "options": {"url": "redis://h:6379/0", "ttl_s": 30, "tls": {"verify": False}},
            },
            "limits": {
                "job_max_restart": 7,
                "node_max_restart": 6,
                "master_max_restart": 5,
                "global_restart_budget": 4,
            },
            "health": {
                "heartbeat_interval_s": 2,
                "heartbeat_timeout_s": 20,
                "hang_timeout_s": 600,
                "monitor_interval_s": 0.5,
            },
            "master": {
                "cpu": 2,
                "memory": "1GiB",
                "isolation_resource": "head",
                "worker_isolation_resource": "worker",
            },
        }
    )


def test_rich_spec_is_really_rich() -> None:
    spec = rich_spec()
    defaults = JobSpec(name="x", roles=[{"name": "r", "entrypoint": "a:b"}])  # pyright: ignore[reportArgumentType]
    for section in ("config", "env", "collocations", "state_store", "limits", "health", "master"):
        assert getattr(spec, section) != getattr(defaults, section), section
    trainer = spec.role("trainer")
    assert trainer.elastic is not None
    assert trainer.elastic.comm_backend is CommBackend.NCCL
    assert trainer.elastic.node_check.exclude_stragglers
    assert (trainer.total, trainer.per_group) == (4, 2)  # derived from nnodes x nproc_per_node
    assert trainer.recovery is RecoveryPolicy.GLOBAL
    assert spec.placement_strategy is PlacementStrategy.SPREAD
    assert spec.role("coordinator").kind is RoleKind.CUSTOM


@pytest.mark.parametrize("fmt", ["yaml", "json"])
def test_round_trip_is_exact(fmt: str) -> None:
    spec = rich_spec()
    text = dump_spec(spec, fmt)
    again = load_spec_text(text, fmt=fmt)
    assert again == spec
    assert dump_spec(again, fmt) == text
    assert spec_to_dict(again) == spec_to_dict(spec)


def test_json_dump_is_strict_json_and_yaml_reads_it() -> None:
    spec = rich_spec()
    text = dump_spec(spec, "json")
    data: dict[str, Any] = json.loads(text)
    assert data["roles"][0]["resources"]["memory"] == 16 * GiB
    assert data["config"]["nested"]["on"] == "off"
    assert load_spec_text(text, fmt="yaml") == spec


def test_yaml_dump_keeps_ambiguous_strings_as_strings() -> None:
    data = yaml.safe_load(dump_spec(rich_spec()))
    assert data["config"]["nested"]["on"] == "off"
    assert data["config"]["nested"]["a"]["b"]["c"] == "yes"
    assert data["config"]["nested"]["num_str"] == "1.0"
    assert data["roles"][0]["elastic"]["nnodes"] == "1:2"


@pytest.mark.parametrize("suffix", [".yaml", ".yml", ".json"])
def test_round_trip_through_files(tmp_path: Path, suffix: str) -> None:
    spec = rich_spec()
    path = tmp_path / f"job{suffix}"
    path.write_text(dump_spec(spec, "json" if suffix == ".json" else "yaml"), encoding="utf-8")
    assert load_spec(path) == spec
    assert load_spec(str(path)) == spec


@pytest.mark.parametrize(
    ("text", "expected"),
    [("4GiB", 4 * GiB), ("512MB", 512 * 10**6), ("1.5GiB", 3 * GiB // 2), (8 * GiB, 8 * GiB)],
)
def test_memory_strings_load_as_bytes(text: object, expected: int) -> None:
    spec = spec_from_dict(
        {
            "name": "mem",
            "roles": [{"name": "w", "entrypoint": "w:main", "resources": {"memory": text}}],
            "master": {"memory": text},
        }
    )
    assert spec.roles[0].resources.memory == expected
    assert spec.master.memory == expected
    assert yaml.safe_load(dump_spec(spec))["roles"][0]["resources"]["memory"] == expected


# Builders versus spec files ---------------------------------------------------------------

SPEC_YAML = """\
name: demo
node_num: 2
device_per_node: 4
config:
  lr: 0.01
  model: {name: tiny, layers: [64, 64]}
env:
  GLOBAL: "1"
state_store:
  name: memory
  options: {namespace: demo}
limits:
  job_max_restart: 3
  global_restart_budget: 1
health:
  heartbeat_timeout_s: 60
  hang_timeout_s: 900
master:
  cpu: 2
  memory: 2GiB
  isolation_resource: head
roles:
  - name: trainer
    kind: elastic
    entrypoint: pkg.train:main
    resources: {cpu: 4, memory: 8GiB}
    max_restart: 2
    elastic:
      nnodes: "2"
      nproc_per_node: 2
      comm_backend: gloo
      node_check: {enabled: false, straggler_ratio: 3.0}
      setup_process_group: false
  - name: server
    kind: simple
    entrypoint: -m pkg.server --port 0
    total: 2
    per_group: 2
    resources: {gpu: 0.5, memory: 512MiB, custom: {accel: 1}}
    env: {ROLE: server}
    is_driver: false
    rank_based_gpu_selection: true
  - name: logger
    entrypoint: pkg.log:Logger
    total: 2
    per_group: 2
    is_driver: false
    recovery: global
    escalate_after: 5
collocations:
  - roles: [server, logger]
"""


def demo_builder() -> DLJobBuilder:
    builder = (
        DLJobBuilder("demo")
        .node_num(2)
        .device_per_node(4)
        .config({"lr": 0.01}, model={"name": "tiny", "layers": [64, 64]})
        .global_env(GLOBAL="1")
        .state_store("memory", namespace="demo")
        .limits(job_max_restart=3, global_restart_budget=1)
        .health(heartbeat_timeout_s=60, hang_timeout_s=900)
        .master(cpu=2, memory="2GiB", isolation_resource="head")
    )
    (
        builder.train("pkg.train:main")
        .nnodes(2)
        .nproc_per_node(2)
        .comm_backend("gloo")
        .skip_node_check()
        .node_check(straggler_ratio=3.0)
        .no_setup_process_group()
        .resource(cpu=4, memory="8GiB")
        .max_restart(2)
    )
    (
        builder.role("server")
        .run("-m pkg.server --port 0")
        .total(2)
        .per_group(2)
        .resource(gpu=0.5, memory="512MiB", accel=1)
        .env(ROLE="server")
        .not_driver()
        .rank_based_gpu_selection()
    )
    (
        builder.workload("logger", "pkg.log:Logger")
        .total(2)
        .per_group(2)
        .not_driver()
        .recovery("global", escalate_after=5)
    )
    return builder.with_collocation("server", "logger")


def test_builder_and_spec_file_give_the_same_spec(tmp_path: Path) -> None:
    path = tmp_path / "demo.yaml"
    path.write_text(SPEC_YAML, encoding="utf-8")
    from_file = load_spec(path)
    built = demo_builder().build()
    assert built == from_file
    assert dump_spec(built) == dump_spec(from_file)
    # spot checks that both really carry the values
    trainer = built.role("trainer")
    assert trainer.elastic is not None
    assert trainer.elastic.node_check.enabled is False
    assert trainer.elastic.node_check.straggler_ratio == 3.0
    assert trainer.elastic.setup_process_group is False
    assert (trainer.total, trainer.per_group) == (4, 2)
    assert trainer.resources.memory == 8 * GiB
    assert built.role("server").resources.custom == {"accel": 1.0}
    assert built.master.memory == 2 * GiB
    assert built.collocation_of("logger") == 0
    assert built.collocation_of("trainer") is None


def test_builder_round_trips() -> None:
    spec = demo_builder().build()
    assert load_spec_text(dump_spec(spec)) == spec
    assert load_spec_text(dump_spec(spec, "json"), fmt="json") == spec


def test_builder_chains_job_calls_after_a_role() -> None:
    spec = (
        DLJobBuilder("chain")
        .device_type("cpu")
        .device_per_node(0)
        .role("a")
        .run("a:main")
        .total(2)
        .role("b")
        .run("b.py")
        .not_driver()
        .end()
        .placement_strategy("strict_spread")
        .build()
    )
    assert [r.name for r in spec.roles] == ["a", "b"]
    assert spec.role("a").total == 2
    assert spec.device_type is DeviceType.CPU
    assert spec.placement_strategy is PlacementStrategy.STRICT_SPREAD


def test_rl_job_builder_roles_and_drivers() -> None:
    builder = RLJobBuilder("rl").node_num(2).device_per_node(8)
    builder.trainer("rl.trainer:Trainer").total(2).per_group(2).resource(gpu=1)
    builder.actor("rl.actor:Actor").total(2).per_group(2).resource(gpu=0.5)
    builder.critic("rl.critic:Critic").total(2).per_group(2).resource(gpu=0.5)
    builder.rollout("rl.rollout:Rollout").total(2).per_group(2).resource(gpu=1)
    builder.reference("rl.ref:Reference").total(2).per_group(2).resource(gpu=0.25)
    builder.reward("rl.reward:Reward").total(2).per_group(2).resource(gpu=0.25)
    spec = builder.with_collocation("actor", "critic").build()

    names = ["trainer", "actor", "critic", "rollout", "reference", "reward"]
    assert [r.name for r in spec.roles] == names
    assert {r.name: r.is_driver for r in spec.roles} == {n: n == "trainer" for n in names}
    assert all(r.kind is RoleKind.SIMPLE for r in spec.roles)
    assert spec.role("reference").resources.gpu == 0.25
    assert [c.roles for c in spec.collocations] == [["actor", "critic"]]
    assert load_spec_text(dump_spec(spec)) == spec


def test_rl_job_builder_equals_hand_written_yaml() -> None:
    builder = RLJobBuilder("rl")
    builder.trainer("rl.trainer:main")
    builder.rollout("rl.rollout:Rollout")
    text = textwrap.dedent(
        """\
        name: rl
        roles:
          - {name: trainer, entrypoint: rl.trainer:main}
          - {name: rollout, entrypoint: rl.rollout:Rollout, is_driver: false}
        """
    )
    assert builder.build() == load_spec_text(text)


def test_with_collocation_all_excludes_named_roles() -> None:
    builder = RLJobBuilder("rl").node_num(1).device_per_node(8)
    builder.trainer("rl.trainer:main").total(2).per_group(2)
    builder.actor("rl.actor:Actor").total(2).per_group(2).resource(gpu=0.5)
    builder.rollout("rl.rollout:Rollout").total(2).per_group(2).resource(gpu=0.5)
    builder.reward("rl.reward:Reward").total(2).per_group(2)
    spec = builder.with_collocation_all("trainer").build()
    assert [c.roles for c in spec.collocations] == [["actor", "rollout", "reward"]]
    assert spec.collocation_of("trainer") is None
    assert spec.collocation_of("reward") == 0

    everything = builder.to_dict()
    assert "collocations" in everything
    all_roles = DLJobBuilder("two")
    all_roles.role("a").run("a:main")
    all_roles.role("b").run("b:main").not_driver()
    assert [c.roles for c in all_roles.with_collocation_all().build().collocations] == [["a", "b"]]


def test_elastic_builder_nnodes_and_nproc_per_node() -> None:
    builder = DLJobBuilder("el").node_num(4).device_per_node(4)
    builder.role("learner").train("pkg.learn:main").nnodes("2:4").nproc_per_node(4)
    role = builder.build().role("learner")
    assert role.kind is RoleKind.ELASTIC
    assert role.elastic is not None
    assert (role.elastic.nnodes, role.elastic.min_nodes, role.elastic.max_nodes) == ("2:4", 2, 4)
    assert role.elastic.nproc_per_node == 4
    assert (role.total, role.per_group) == (16, 4)
    assert role.resources.gpu == 1.0


def test_elastic_builder_defaults() -> None:
    builder = DLJobBuilder("el")
    builder.train("pkg.learn:main")
    role = builder.build().role("trainer")
    assert role.elastic is not None
    assert role.elastic.node_check.enabled is True
    assert role.elastic.setup_process_group is True
    assert (role.elastic.nnodes, role.elastic.nproc_per_node, role.total) == ("1", 1, 1)


def test_builder_rejects_a_role_twice_and_a_nameless_role() -> None:
    builder = DLJobBuilder("dup")
    builder.role("a").run("a:main")
    with pytest.raises(ValueError, match="defined twice"):
        builder.role("a").run("a:other")
    with pytest.raises(ValueError, match=r"role\(name\)"):
        builder.run("b:main")


def test_builder_errors_come_back_as_spec_errors() -> None:
    builder = DLJobBuilder("bad").node_num(0)
    builder.role("w").run("w:main").total(3).per_group(2)
    with pytest.raises(SpecError) as info:
        builder.build()
    got = {p.field for p in info.value.problems}
    assert {"node_num", "roles[w].total"} <= got


# Load errors ---------------------------------------------------------------------------


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(SpecError) as info:
        load_spec(tmp_path / "nope.yaml")
    [problem] = info.value.problems
    assert problem.field == "spec"
    assert "nope.yaml" in problem.message
    assert problem.fix


@pytest.mark.parametrize(
    ("text", "fmt"),
    [
        ("name: [unclosed\n", "yaml"),
        ("name: a\n  roles: : :\n", "yaml"),
        ('{"name": "a",}', "json"),
    ],
)
def test_malformed_text(tmp_path: Path, text: str, fmt: str) -> None:
    path = tmp_path / f"job.{fmt}"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(SpecError) as info:
        load_spec(path)
    [problem] = info.value.problems
    assert problem.field == "spec"
    assert f"cannot parse {fmt.upper()}" in problem.message
    assert problem.fix


@pytest.mark.parametrize("text", ["", "- a\n- b\n", "just a string\n"])
def test_spec_that_is_not_a_mapping(text: str) -> None:
    with pytest.raises(SpecError) as info:
        load_spec_text(text)
    assert [p.field for p in info.value.problems] == ["spec"]


def _problems(data: dict[str, Any]) -> dict[str, str]:
    with pytest.raises(SpecError) as info:
        spec_from_dict(data)
    return {p.field: p.fix for p in info.value.problems}


def _job(**role: Any) -> dict[str, Any]:
    return {"name": "ok", "roles": [{"name": "trainer", "entrypoint": "t:main", **role}]}


@pytest.mark.parametrize(
    ("data", "field", "fix_part"),
    [
        (
            {**_job(), "colour": "red"},
            "colour",
            "remove 'colour'; the top level of the spec takes: api_version",
        ),
        (_job(speed=3), "roles[trainer].speed", "remove 'speed'; roles[trainer] takes: name, kind"),
        (_job(pergroup=3), "roles[trainer].pergroup", "or rename it to 'per_group'"),
        (
            _job(resources={"cpu": "lots"}),
            "roles[trainer].resources.cpu",
            "set cpu to a number, e.g. cpu: 1.0",
        ),
        (_job(resources={"cpu": -1}), "roles[trainer].resources.cpu", ">= 0"),
        (_job(resources={"memory": "4XB"}), "roles[trainer].resources.memory", "e.g. memory: 4GiB"),
        (_job(resources={"custom": {"GPU": 1}}), "roles[trainer].resources.custom", "cpu, gpu and memory"),
        (_job(total="many"), "roles[trainer].total", "set total to a whole number, e.g. total: 1"),
        (_job(is_driver="maybe"), "roles[trainer].is_driver", "set is_driver to true or false"),
        (_job(env={"A": 1}), "roles[trainer].env.A", "e.g. A: '8'"),
        ({**_job(), "health": "x"}, "health", "it takes: heartbeat_interval_s"),
        ({**_job(), "roles": "x"}, "roles", "make roles a list"),
        (_job(kind="weird"), "roles[trainer].kind", "'simple', 'elastic' or 'custom'"),
        (_job(kind="elastic", elastic={"nnodes": "3:1"}), "roles[trainer].elastic.nnodes", ""),
        (_job(elastic={"nproc_per_node": 0}), "roles[trainer].elastic.nproc_per_node", ">= 1"),
        (_job(entrypoint=""), "roles[trainer].entrypoint", ""),
        (_job(name="9lives"), "roles[9lives].name", "match the pattern"),
        ({**_job(), "name": "Bad_Name"}, "name", "match the pattern"),
        ({**_job(), "name": "-x"}, "name", "match the pattern"),
        ({"name": "ok"}, "roles", "add 'roles:' to the top level of the spec"),
        ({"name": "ok", "roles": []}, "roles", "at least 1"),
        ({**_job(), "api_version": "dlu/v0"}, "api_version", "'dlu/v1'"),
        ({**_job(), "device_type": "TPU"}, "device_type", "'GPU' or 'CPU'"),
        ({**_job(), "collocations": [{"roles": ["trainer"]}]}, "collocations[0].roles", "at least 2"),
        ({**_job(), "health": {"heartbeat_interval_s": 0}}, "health.heartbeat_interval_s", "> 0"),
        ({**_job(), "limits": {"job_max_restart": -1}}, "limits.job_max_restart", ">= 0"),
        ({**_job(), "master": {"memory": True}}, "master.memory", ""),
        ({**_job(), "state_store": {"nme": "redis"}}, "state_store.nme", "rename it to 'name'"),
    ],
)
def test_pydantic_errors_become_problems_with_readable_fields(
    data: dict[str, Any], field: str, fix_part: str
) -> None:
    problems = _problems(data)
    assert field in problems, problems
    assert problems[field]
    assert fix_part in problems[field]
    assert "dlu schema" not in problems[field]  # each fix says what to write, here


def test_pydantic_errors_use_role_names_and_report_all() -> None:
    data = {
        "name": "Bad",
        "extra": 1,
        "roles": [
            {"name": "a", "entrypoint": "a:main", "resources": {"cpu": "x"}},
            {"name": "b", "entrypoint": "b:main", "total": "y"},
            {"entrypoint": "c:main"},
        ],
    }
    with pytest.raises(SpecError) as info:
        spec_from_dict(data)
    got = {p.field for p in info.value.problems}
    assert got == {"name", "extra", "roles[a].resources.cpu", "roles[b].total", "roles[2].name"}
    missing = next(p for p in info.value.problems if p.field == "roles[2].name")
    assert missing.fix == "add 'name:' to roles[2]."


def test_validate_false_skips_rules_but_not_types() -> None:
    data = _job(total=0)
    assert spec_from_dict(data, validate=False).roles[0].total == 0
    with pytest.raises(SpecError):
        spec_from_dict(data)
    with pytest.raises(SpecError):
        spec_from_dict(_job(total="x"), validate=False)
