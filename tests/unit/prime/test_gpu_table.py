"""The GPU table and cases A/B of the architecture seed, one case per row: who sets
CUDA_VISIBLE_DEVICES, LOCAL_RANK and the torch devices each rank uses."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest

from dlu_api.spec import spec_from_dict
from dlu_api.spec.models import JobSpec, RoleSpec
from dlu_prime.scheduler import (
    DeviceEnv,
    device_env,
    needs_rank_based_selection,
    plan_placement,
    ray_noset_visible_devices,
    visible_devices_policy,
)

RAY = "ray"  # CUDA_VISIBLE_DEVICES: Ray's allocation


def gpu_job(*roles: dict[str, Any], node_num: int = 2) -> JobSpec:
    return spec_from_dict(
        {
            "name": "gpu-job",
            "device_type": "GPU",
            "device_per_node": 8,
            "node_num": node_num,
            "roles": list(roles),
        }
    )


def role(
    gpu: float, per_group: int, rank_based: bool, name: str = "r", total: int | None = None
) -> dict[str, Any]:
    return {
        "name": name,
        "entrypoint": "m:f",
        "total": total or per_group,
        "per_group": per_group,
        "resources": {"gpu": gpu},
        "rank_based_gpu_selection": rank_based,
    }


def envs(spec: JobSpec, name: str, bundle_ids: list[list[str]] | None = None) -> list[DeviceEnv]:
    """DeviceEnv of every actor of the role's first bundle, given the Ray ids of that bundle."""
    spec_role = spec.role(name)
    return [
        device_env(spec_role, a.local_rank, spec.device_type, spec.device_per_node, bundle_ids)
        for a in plan_placement(spec).actors_of(name)
        if a.bundle_index == 0
    ]


@dataclass(frozen=True)
class Row:
    gpu: float
    per_group: int
    rank_based: bool
    visible: str | None  # RAY, a manual value, or None for not set
    devices: list[tuple[str, ...]]  # per local rank


def cuda(*indices: int) -> tuple[str, ...]:
    return tuple(f"cuda:{i}" for i in indices)


ROWS = {
    "gpu1-pg1-default": Row(1, 1, False, RAY, [cuda(0)]),
    "gpu2-pg1": Row(2, 1, False, RAY, [cuda(0, 1)]),
    "gpu2-pg4": Row(2, 4, False, RAY, [cuda(0, 1)] * 4),
    "gpu1-pg8": Row(1, 8, False, RAY, [cuda(0)] * 8),
    "gpu1-pg8-rank-based": Row(1, 8, True, None, [cuda(i) for i in range(8)]),
    "caseB-gpu0.5-pg1": Row(0.5, 1, False, RAY, [cuda(0)]),
    "caseB-gpu0.5-pg8-rank-based": Row(0.5, 8, True, None, [cuda(i) for i in range(8)]),
}


@pytest.mark.parametrize("row", list(ROWS.values()), ids=list(ROWS))
def test_gpu_table_row(row: Row) -> None:
    spec = gpu_job(role(row.gpu, row.per_group, row.rank_based))
    result = envs(spec, "r")
    assert [e.local_rank for e in result] == list(range(row.per_group))
    assert [e.env()["LOCAL_RANK"] for e in result] == [str(i) for i in range(row.per_group)]
    assert [e.devices for e in result] == row.devices
    for e in result:
        assert e.cuda_visible_devices is None
        assert "CUDA_VISIBLE_DEVICES" not in e.env()
        if row.visible == RAY:
            assert e.set_by == "ray"
            assert not e.ray_noset_visible_devices
        else:
            assert e.set_by == "not_set"
            assert e.ray_noset_visible_devices
    assert ray_noset_visible_devices(spec.role("r")) is (row.visible != RAY)


def test_case_a_two_groups_share_a_node_on_different_gpus() -> None:
    spec = gpu_job(role(1, 4, True, name="a"), role(1, 4, True, name="b"), node_num=1)
    ids_a = [["0"], ["1"], ["2"], ["3"]]
    ids_b = [["6"], ["4"], ["7"], ["5"]]  # Ray's ids, in local-rank order, need not be sorted
    for name, ids, expected in (("a", ids_a, "0,1,2,3"), ("b", ids_b, "4,5,6,7")):
        assert visible_devices_policy(spec.role(name), spec.device_type, spec.device_per_node) == "manual"
        assert ray_noset_visible_devices(spec.role(name))
        result = envs(spec, name, ids)
        assert [e.cuda_visible_devices for e in result] == [expected] * 4
        assert [e.set_by for e in result] == ["manual"] * 4
        assert [e.env() for e in result] == [
            {
                "LOCAL_RANK": str(i),
                "CUDA_VISIBLE_DEVICES": expected,
                "DLU_DEVICE": f"cuda:{i}",
                "DLU_DEVICES": f"cuda:{i}",
            }
            for i in range(4)
        ]
        assert [e.devices for e in result] == [cuda(i) for i in range(4)]
        assert all(e.ray_noset_visible_devices for e in result)


def test_manual_ids_sort_numerically_and_dedupe() -> None:
    spec = gpu_job(role(1, 2, True))
    result = device_env(spec.role("r"), 1, "GPU", 16, [["10"], ["2"], ["2"]])
    assert result.cuda_visible_devices == "2,10"
    assert result.devices == ("cuda:1",)


def test_manual_needs_the_bundle_gpu_ids() -> None:
    spec = gpu_job(role(1, 4, True))
    with pytest.raises(ValueError, match="group_gpu_ids"):
        device_env(spec.role("r"), 0, "GPU", 8, None)
    with pytest.raises(ValueError, match="local_rank 3"):
        device_env(spec.role("r"), 3, "GPU", 8, [["0"], ["1"]])


def test_rank_based_bundle_spanning_the_node_is_not_set() -> None:
    spec = gpu_job(role(1, 4, True))
    result = device_env(spec.role("r"), 2, "GPU", 4, None)
    assert (result.set_by, result.cuda_visible_devices, result.devices) == ("not_set", None, ("cuda:2",))


@pytest.mark.parametrize(
    "spec_data",
    [
        {
            "name": "cpu",
            "device_type": "CPU",
            "roles": [{"name": "r", "entrypoint": "m:f", "total": 2, "per_group": 2}],
        },
        {"name": "zero", "roles": [{"name": "r", "entrypoint": "m:f", "resources": {"gpu": 0}}]},
    ],
    ids=["cpu-job", "gpu-job-zero-gpu"],
)
def test_no_gpu_means_cpu_device(spec_data: dict[str, Any]) -> None:
    spec = spec_from_dict(spec_data)
    for actor in plan_placement(spec).actors_of("r"):
        result = device_env(spec.role("r"), actor.local_rank, spec.device_type, spec.device_per_node, None)
        assert result == type(result)(None, "none", actor.local_rank, ("cpu",))
        assert result.env() == {
            "LOCAL_RANK": str(actor.local_rank),
            "DLU_DEVICE": "cpu",
            "DLU_DEVICES": "cpu",
        }
        assert not result.ray_noset_visible_devices
    assert not ray_noset_visible_devices(spec.role("r"))


def test_rank_based_flag_outside_its_valid_range_falls_back_to_ray() -> None:
    # the spec rules reject this; the pure function still gives a sane answer
    bad = RoleSpec(name="r", entrypoint="m:f", per_group=1, rank_based_gpu_selection=True)
    bad.resources.gpu = 1
    assert not needs_rank_based_selection(bad)
    assert device_env(bad, 0, "GPU", 8, None).set_by == "ray"


def test_local_rank_outside_the_bundle_is_an_error() -> None:
    spec = gpu_job(role(1, 2, False))
    with pytest.raises(ValueError, match="outside"):
        device_env(spec.role("r"), 2, "GPU", 8, None)
