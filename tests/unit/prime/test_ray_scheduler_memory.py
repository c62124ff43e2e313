"""The Ray scheduler's side of a memory relaunch, with Ray's calls replaced: an actor given more
memory is created in a placement group of its own of that size, a group of an older size is
removed first, and an actor given its role's amount again goes back to its role's bundle."""

from __future__ import annotations

from typing import Any

import pytest

from dlu_api.spec import spec_from_dict
from dlu_prime.scheduler import ray_scheduler
from dlu_prime.scheduler.placement import GroupPlan
from dlu_prime.scheduler.ray_scheduler import RayScheduler

pytestmark = pytest.mark.timeout(30)

MiB = 2**20
NAME = "lm.prep.1"


@pytest.fixture
def scheduler(monkeypatch: pytest.MonkeyPatch) -> tuple[RayScheduler, dict[str, list[Any]]]:
    seen: dict[str, list[Any]] = {"placed": [], "removed": []}
    spec = spec_from_dict(
        {
            "name": "lm",
            "roles": [{"name": "prep", "entrypoint": "m:f", "total": 2, "resources": {"memory": "512MiB"}}],
        }
    )
    found = RayScheduler(spec)

    def wait(groups: list[GroupPlan] | None = None) -> None:
        seen["placed"].extend(g.name for g in groups or ())

    monkeypatch.setattr(found, "_wait_placement", wait)
    monkeypatch.setattr(ray_scheduler, "remove_group", seen["removed"].append)
    return found, seen


def test_more_memory_means_a_group_of_its_own_and_an_older_size_is_removed(
    scheduler: tuple[RayScheduler, dict[str, list[Any]]],
) -> None:
    found, seen = scheduler
    base = found._by_name[NAME]  # pyright: ignore[reportPrivateUsage]
    assert found.memory_groups.sized(base) == base
    found.set_memory({NAME: 768 * MiB, "lm.prep.submaster": 1})  # a SubMaster is not a worker: ignored
    sized = found.memory_groups.sized(base)
    assert sized.options["memory"] == 768 * MiB and sized.group == f"prep.1.mem{768 * MiB}"
    assert seen["placed"] == [sized.group] and seen["removed"] == []
    found.set_memory({NAME: 1152 * MiB})
    bigger = found.memory_groups.sized(base)
    assert bigger.group == f"prep.1.mem{1152 * MiB}"
    assert seen["removed"] == [f"lm.pg.prep.1.mem{768 * MiB}"]  # the older size is gone first
    found.set_memory({NAME: 512 * MiB})  # its role's amount: back to its role's bundle
    assert found.memory_groups.sized(base) == base
    assert seen["removed"][-1] == f"lm.pg.prep.1.mem{1152 * MiB}"


def test_a_rebuilt_scheduler_told_the_override_removes_the_adopted_group_on_the_next_size(
    scheduler: tuple[RayScheduler, dict[str, list[Any]]],
) -> None:
    found, seen = scheduler
    base = found._by_name[NAME]  # pyright: ignore[reportPrivateUsage]
    found.set_memory({NAME: 768 * MiB})  # what a rebuilt PrimeMaster tells it first
    found.set_memory({NAME: 1152 * MiB})  # then a later relaunch
    found.memory_groups.sized(base)
    assert seen["removed"] == [f"lm.pg.prep.1.mem{768 * MiB}"]
