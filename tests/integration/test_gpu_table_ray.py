"""The GPU table and cases A/B of the architecture seed, on Ray's logical GPUs (no GPU needed)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from dlu_api.spec import spec_from_dict

pytestmark = [pytest.mark.ray, pytest.mark.timeout(120)]

WORKDIR = str(Path(__file__).parent)


def run_recording(
    tmp_path: Path, name: str, roles: list[dict[str, Any]], collocations: Any = ()
) -> list[dict[str, Any]]:
    from dlu_prime import launcher

    spec = spec_from_dict(
        {
            "name": name,
            "device_type": "GPU",
            "node_num": 1,
            "device_per_node": 8,
            "config": {"out_dir": str(tmp_path)},
            "health": {"monitor_interval_s": 0.2},
            "roles": roles,
            "collocations": [{"roles": list(c)} for c in collocations],
        }
    )
    status = launcher.run_job(spec, WORKDIR)
    assert status.exit_code == 0, status.reason
    records = [json.loads(p.read_text()) for p in sorted(tmp_path.glob(f"{name}.*.json"))]
    return sorted(records, key=lambda r: (r["role"], r["rank"]))


def gpu_role(name: str, gpu: float, total: int, per_group: int, rank_based: bool = False) -> dict[str, Any]:
    return {
        "name": name,
        "entrypoint": "workloads:record_env",
        "total": total,
        "per_group": per_group,
        "rank_based_gpu_selection": rank_based,
        "resources": {"cpu": 0.1, "gpu": gpu},
    }


def test_row_gpu1_group1_ray_allocation(ray_session: Any, tmp_path: Path) -> None:
    records = run_recording(tmp_path, "gpu-r1", [gpu_role("r", 1, 2, 1)])
    for r in records:
        assert r["local_rank"] == "0"
        assert r["cuda_visible_devices"] == ",".join(r["ray_gpu_ids"]) and len(r["ray_gpu_ids"]) == 1
        assert r["dlu_devices"] == "cuda:0"
    assert records[0]["ray_gpu_ids"] != records[1]["ray_gpu_ids"]


def test_row_gpu2_group1_two_devices(ray_session: Any, tmp_path: Path) -> None:
    records = run_recording(tmp_path, "gpu-r2", [gpu_role("r", 2, 2, 1)])
    for r in records:
        assert r["local_rank"] == "0"
        assert len(r["cuda_visible_devices"].split(",")) == 2
        assert r["dlu_devices"] == "cuda:0,cuda:1"


def test_row_gpu2_group4_local_ranks(ray_session: Any, tmp_path: Path) -> None:
    records = run_recording(tmp_path, "gpu-r3", [gpu_role("r", 2, 4, 4)])
    assert [r["local_rank"] for r in records] == ["0", "1", "2", "3"]
    for r in records:
        assert len(r["cuda_visible_devices"].split(",")) == 2
        assert r["dlu_devices"] == "cuda:0,cuda:1"
    assert len({g for r in records for g in r["ray_gpu_ids"]}) == 8


def test_row_gpu1_group8_without_rank_selection(ray_session: Any, tmp_path: Path) -> None:
    records = run_recording(tmp_path, "gpu-r4", [gpu_role("r", 1, 8, 8)])
    assert [r["local_rank"] for r in records] == [str(i) for i in range(8)]
    for r in records:
        assert r["cuda_visible_devices"] == r["ray_gpu_ids"][0]
        assert r["dlu_devices"] == "cuda:0"


def test_row_gpu1_group8_rank_based_not_set(ray_session: Any, tmp_path: Path) -> None:
    records = run_recording(tmp_path, "gpu-r5", [gpu_role("r", 1, 8, 8, rank_based=True)])
    for r in records:
        assert r["cuda_visible_devices"] is None  # NOT_SET: every GPU of the node is visible
        assert r["dlu_devices"] == f"cuda:{r['local_rank']}"


def test_case_a_two_roles_share_a_node_on_different_gpus(ray_session: Any, tmp_path: Path) -> None:
    records = run_recording(
        tmp_path,
        "gpu-ca",
        [gpu_role("a", 1, 4, 4, rank_based=True), gpu_role("b", 1, 4, 4, rank_based=True)],
    )
    by_role: dict[str, set[str]] = {}
    for r in records:
        visible = r["cuda_visible_devices"].split(",")
        assert len(visible) == 4 and sorted(r["ray_gpu_ids"])[0] in visible
        assert r["dlu_devices"] == f"cuda:{r['local_rank']}"
        by_role.setdefault(r["role"], set()).add(r["cuda_visible_devices"])
    assert len(by_role["a"]) == 1 and len(by_role["b"]) == 1  # one manual set per role group
    assert set(next(iter(by_role["a"])).split(",")).isdisjoint(next(iter(by_role["b"])).split(","))


def test_case_b_half_gpus_share_each_gpu(ray_session: Any, tmp_path: Path) -> None:
    records = run_recording(tmp_path, "gpu-cb", [gpu_role("r", 0.5, 16, 1)])
    for r in records:
        assert r["local_rank"] == "0"
        assert r["dlu_devices"] == "cuda:0"
        assert len(r["ray_gpu_ids"]) == 1
    assert len({r["ray_gpu_ids"][0] for r in records}) == 8  # two actors on each GPU


def test_case_b_rank_based_not_set(ray_session: Any, tmp_path: Path) -> None:
    records = run_recording(tmp_path, "gpu-cbr", [gpu_role("r", 0.5, 8, 8, rank_based=True)])
    for r in records:
        assert r["cuda_visible_devices"] is None
        assert r["dlu_devices"] == f"cuda:{r['local_rank']}"
