"""A job's placement groups are removed by name (Ray's public lookup), and by id where the name
is not visible from this driver's namespace (the guarded fallback)."""

from __future__ import annotations

from typing import Any

import pytest

from dlu_prime.naming import job_prefix
from dlu_prime.scheduler import cleanup

pytestmark = [pytest.mark.ray, pytest.mark.timeout(120)]


def _group(job: str, index: int) -> Any:
    import ray
    from ray.util import placement_group

    group = placement_group([{"CPU": 0.01}], name=f"{job_prefix(job)}pg{index}")
    ray.get(group.ready(), timeout=30)
    return group


def test_placement_groups_are_removed_by_name(ray_session: Any) -> None:
    groups = [_group("pg-by-name", i) for i in range(2)]
    assert [pg_id for pg_id, _ in cleanup.job_placement_groups("pg-by-name")] == sorted(
        g.id.hex() for g in groups
    )
    assert cleanup.remove_job_resources("pg-by-name", include_master=True) == 2
    assert cleanup.job_placement_groups("pg-by-name") == []


def test_a_group_not_found_by_name_is_removed_by_id(
    ray_session: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    import ray.util

    _group("pg-by-id", 0)

    def elsewhere(name: str) -> Any:
        raise ValueError(f"Failed to look up placement group with name: {name}")

    monkeypatch.setattr(ray.util, "get_placement_group", elsewhere)
    assert cleanup.remove_job_resources("pg-by-id", include_master=True) == 1
    assert cleanup.job_placement_groups("pg-by-id") == []
