"""The Ray scheduler's side of a memory relaunch, with Ray's calls replaced: an actor given more
memory is created in a placement group of its own of that size, a group of an older size is
removed first, and an actor given its role's amount again goes back to its role's bundle."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from dlu_api.spec import spec_from_dict
from dlu_prime.scheduler import ray_scheduler
from dlu_prime.scheduler.free_bundles import Ledger
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

    def wait(groups: list[GroupPlan] | None = None, wait_s: float | None = None) -> None:
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


def test_the_group_an_actor_left_is_given_back_once_no_actor_of_the_job_is_left_in_it(
    scheduler: tuple[RayScheduler, dict[str, list[Any]]],
) -> None:
    """Issue 30: the role's bundle of a relaunched actor stayed reserved until the job ended."""
    found, seen = scheduler
    plans = found._by_name  # pyright: ignore[reportPrivateUsage]
    found.set_memory({NAME: 768 * MiB})
    found.memory_groups.sized(plans[NAME], plans)
    assert seen["removed"] == []  # lm.prep.0 is still in the role's group: removing it would kill it
    assert not found.memory_groups.vacated(plans, "prep")
    found.set_memory({"lm.prep.0": 768 * MiB})
    found.memory_groups.sized(plans["lm.prep.0"], plans)
    assert seen["removed"] == ["lm.pg.prep"] and found.memory_groups.released == {"prep"}
    found.memory_groups.sized(plans["lm.prep.0"], plans)  # a later incarnation: given back again (idempotent)
    assert seen["removed"] == ["lm.pg.prep", "lm.pg.prep"]
    found.set_memory({NAME: 512 * MiB})  # back at its role's memory: the role's group is asked for again
    assert found.memory_groups.sized(plans[NAME], plans) == plans[NAME]
    assert seen["placed"][-1] == "prep" and found.memory_groups.released == set()
    assert seen["removed"][-1] == f"lm.pg.prep.1.mem{768 * MiB}"


def test_a_node_group_of_an_elastic_role_is_never_given_back(monkeypatch: pytest.MonkeyPatch) -> None:
    removed: list[str] = []
    spec = spec_from_dict(
        {
            "name": "lm",
            "roles": [
                {
                    "name": "train",
                    "kind": "elastic",
                    "entrypoint": "m:f",
                    "elastic": {"nnodes": "1:2"},
                    "resources": {"memory": "512MiB"},
                }
            ],
        }
    )
    found = RayScheduler(spec)
    monkeypatch.setattr(found, "_wait_placement", lambda groups=None, wait_s=None: None)
    monkeypatch.setattr(ray_scheduler, "remove_group", removed.append)
    plans = found._by_name  # pyright: ignore[reportPrivateUsage]
    (rank,) = [p for p in plans.values() if p.node_rank == 0]
    found.set_memory({rank.name: 768 * MiB})
    found.memory_groups.sized(rank, plans)
    assert removed == [] and not found.memory_groups.vacated(plans, rank.group)


@pytest.mark.parametrize(
    ("moved", "expected"),
    [((), False), (("a",), False), (("a", "b"), True), (("a", "b", "c"), True)],
)
def test_a_group_is_vacated_when_every_actor_planned_in_it_has_moved(
    scheduler: tuple[RayScheduler, dict[str, list[Any]]], moved: tuple[str, ...], expected: bool
) -> None:
    found, _ = scheduler
    base = found._by_name[NAME]  # pyright: ignore[reportPrivateUsage]
    groups = {g.name: g for g in found.plan.groups}
    plans = {"a": base, "b": base, "c": replace(base, group="other")}
    ledger = Ledger(groups, plans, {name: 768 * MiB for name in moved})
    assert ("prep" in ledger.vacated()) is expected
    assert "nobody" not in ledger.vacated()  # a group no actor is planned in is not ours to give back
    seated = Ledger(groups, plans, {name: 768 * MiB for name in moved}, {"c": ("prep", 1)})
    assert "prep" not in seated.vacated()  # an actor seated in it keeps it


def test_a_relaunched_rank_is_asked_for_on_its_old_node_then_beside_no_other_node_rank() -> None:
    from dlu_prime.scheduler.base import SchedulingError
    from dlu_prime.scheduler.memory_groups import MemoryGroups
    from dlu_prime.scheduler.node_pinning import NODE_ID_LABEL, PIN_WAIT_S
    from dlu_prime.scheduler.placement import plan_placement

    spec = spec_from_dict(
        {
            "name": "lm",
            "roles": [
                {
                    "name": "train",
                    "kind": "elastic",
                    "entrypoint": "m:f",
                    "elastic": {"nnodes": "1:3"},
                    "resources": {"memory": "512MiB"},
                }
            ],
        }
    )
    plans = {a.name: a for a in plan_placement(spec).actors}
    asked: list[tuple[tuple[dict[str, str], ...], float | None]] = []
    removed: list[str] = []

    def place(group: GroupPlan, wait_s: float | None) -> None:
        asked.append((group.labels, wait_s))
        if group.labels and group.labels[0][NODE_ID_LABEL] == "n1":
            raise SchedulingError("no room on n1")

    nodes = {"lm.train.0": "n0", "lm.train.1": "n1", "lm.train.2": "n2"}
    groups = MemoryGroups(spec, {}, place, lambda g: removed.append(g.name), nodes=lambda: nodes)
    groups.set(plans, {"lm.train.1": 768 * MiB})
    sized = groups.sized(plans["lm.train.1"], plans)
    assert asked == [(({NODE_ID_LABEL: "n1"},), PIN_WAIT_S), (({NODE_ID_LABEL: "!in(n0,n2)"},), None)]
    assert removed == [sized.group] and groups.pinned("lm.train.1")  # the pinned try given up first
