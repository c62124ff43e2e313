"""Bundles a memory relaunch left reserved (issue 30): where they are (`free_bundles.Ledger`),
which later actor takes one instead of reserving more (a rank a growth adds, a relaunch whose
new size fits what is left of its bundle), what the timeline and `dlu status` say of them, and
that the state carries the seats to a rebuilt PrimeMaster and to its scheduler."""

from __future__ import annotations

from typing import Any

import pytest

from dlu_api.spec import spec_from_dict
from dlu_api.status import JobStage
from dlu_api.vocabulary import ActorStage, EventKind
from dlu_prime.autoscale import memory
from dlu_prime.master.bundles import ActorsSeated, free_bundles, growth_seats, relaunch_seat
from dlu_prime.master.changes import apply_change
from dlu_prime.master.core import Decision, decide, memory_chain
from dlu_prime.master.core.commands import AddActors, SetSeats
from dlu_prime.master.core.events import ResizeDue, ScaleRequested
from dlu_prime.master.job_status import job_status
from dlu_prime.master.lifecycle import new_state
from dlu_prime.master.relaunch import RelaunchEnded
from dlu_prime.master.state import JobState
from dlu_prime.scheduler import ray_scheduler
from dlu_prime.scheduler.free_bundles import Ledger, needs
from dlu_prime.scheduler.placement import GroupPlan, plan_placement
from dlu_prime.scheduler.ray_scheduler import RayScheduler

pytestmark = pytest.mark.timeout(30)

MiB = 2**20
NOW = 100.0


def _spec(total: int = 2, per_group: int = 1, max_total: int | None = 3) -> Any:
    role: dict[str, Any] = {
        "name": "prep",
        "entrypoint": "pkg.prep:main",
        "total": total,
        "per_group": per_group,
        "resources": {"cpu": 0.5, "memory": "512MiB"},
    }
    if max_total is not None:
        role.update(resizable=True, max_total=max_total)
    return spec_from_dict({"name": "lm", "roles": [role]})


def _running(spec: Any) -> JobState:
    state = new_state(spec)
    state.stage = JobStage.RUNNING
    for record in state.actors.values():
        record.stage = ActorStage.RUNNING
    return state


def _apply(state: JobState, decided: Decision) -> list[tuple[str, str]]:
    return [(str(e.kind), e.message) for c in decided.changes for e in apply_change(state, c, NOW)]


def _relaunch(state: JobState, actor: str, new: int) -> Decision:
    """Begin a relaunch of `actor` with `new` bytes and end it (every step succeeded)."""
    old = state.actors[actor].memory or 512 * MiB
    decision = memory.MemoryDecision(actor, "prep", old, new, f"{actor}: relaunched")
    began = memory_chain.begin(state, decision, NOW)
    _apply(state, began)
    _apply(state, Decision((RelaunchEnded(),)))
    return began


def test_a_relaunch_leaves_its_bundle_free_and_the_status_says_so() -> None:
    state = _running(_spec())
    _relaunch(state, "lm.prep.1", 768 * MiB)
    assert state.actors["lm.prep.1"].seat is None  # 768 MiB fits no bundle of 512: its own group
    kinds = [(e.kind, e.message) for e in state.events[-2:]]
    free = "bundle 1 of group prep free, CPU 0.5, memory 512 MiB reserved unused"
    assert kinds[-1] == (EventKind.BUNDLE_FREE, free)
    assert job_status(state).free_bundles == [free]
    _relaunch(state, "lm.prep.0", 768 * MiB)  # the last actor of the group leaves: given back
    assert state.events[-1].message == "placement group prep given back: no actor of the job is left in it"
    assert free_bundles(state) == []


def test_a_growth_takes_the_free_bundle_instead_of_a_group_of_its_own() -> None:
    state = _running(_spec())
    _relaunch(state, "lm.prep.1", 768 * MiB)
    began = decide(state, ScaleRequested("prep", 3), NOW)
    _apply(state, began)
    due = decide(state, ResizeDue(), NOW)
    assert due.changes == (ActorsSeated({"lm.prep.2": "prep#1"}),)
    assert due.commands == (SetSeats({"lm.prep.2": "prep#1"}), AddActors("prep", (2,), 3))
    said = _apply(state, due)
    assert said == [
        (
            "bundle_reused",
            "lm.prep.2 placed in bundle 1 of group prep, left free by a relaunch: nothing more reserved",
        )
    ]
    assert state.actors["lm.prep.2"].seat == "prep#1" and free_bundles(state) == []
    assert memory_chain.rebuilt(state)[0] == SetSeats({"lm.prep.2": "prep#1"})  # a rebuilt PrimeMaster knows
    assert growth_seats(state, ["lm.prep.2"]) == {}  # seated once only
    assert growth_seats(state, ["lm.prep.0"]) == {}  # a rank of the spec has its own bundle


def test_without_a_relaunch_a_growth_reserves_its_own_group() -> None:
    state = _running(_spec())
    _apply(state, decide(state, ScaleRequested("prep", 3), NOW))
    (add,) = decide(state, ResizeDue(), NOW).commands
    assert add == AddActors("prep", (2,), 3)


def test_a_relaunch_that_fits_its_own_bundle_once_its_mate_left_stays_there() -> None:
    """Option (c): two actors per bundle of 2 x 512 MiB; the first relaunched leaves 512 MiB,
    too little for the second's 768 MiB with it still there, but once it leaves too, 1 GiB is."""
    state = _running(_spec(total=4, per_group=2, max_total=None))
    _relaunch(state, "lm.prep.0", 768 * MiB)
    assert state.actors["lm.prep.0"].seat is None
    began = _relaunch(state, "lm.prep.1", 768 * MiB)
    assert state.actors["lm.prep.1"].seat == "prep#0"
    assert SetSeats({"lm.prep.1": "prep#0"}) in began.commands
    reused = [e for e in state.events if e.kind == EventKind.BUNDLE_REUSED]
    assert [e.message for e in reused] == [
        "lm.prep.1 relaunched into bundle 0 of group prep, which has room for 768 MiB: nothing more reserved"
    ]
    assert [b.text() for b in free_bundles(state)] == [
        "bundle 0 of group prep partly free, CPU 0.5, memory 256 MiB reserved unused"
    ]


def test_a_relaunch_never_keeps_alive_a_group_it_would_leave_empty() -> None:
    """The last actor of a group fits its bundle with more memory (two per bundle): giving the
    group back and reserving the new size alone costs less than keeping the whole bundle."""
    state = _running(_spec(total=2, per_group=2, max_total=None))
    _relaunch(state, "lm.prep.0", 600 * MiB)
    assert relaunch_seat(state, "lm.prep.1", 600 * MiB) is None


def test_the_ledger_counts_what_is_left_of_each_bundle_and_keeps_absent_ranks_bundles() -> None:
    spec = _spec(total=4, per_group=2, max_total=None)
    plan = plan_placement(spec)
    groups = {g.name: g for g in plan.groups}
    plans = {a.name: a for a in plan.actors}
    ledger = Ledger(groups, plans, {"lm.prep.0": 768 * MiB})
    (free,) = ledger.free()
    assert (free.group, free.index, free.empty) == ("prep", 0, False)
    assert free.unused == {"CPU": 0.5, "memory": float(512 * MiB)}
    assert ledger.choose("lm.prep.2", None) == ("prep", 1)  # its own bundle first
    assert needs(plans["lm.prep.0"].options, 768 * MiB) == {"CPU": 0.5, "memory": float(768 * MiB)}
    assert ledger.vacated() == set()


def test_the_scheduler_places_a_seated_actor_in_its_bundle_and_gives_the_group_back_when_it_empties(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    removed: list[str] = []
    placed: list[str] = []
    found = RayScheduler(_spec())

    def wait(groups: list[GroupPlan] | None = None, wait_s: float | None = None) -> None:
        placed.extend(g.name for g in groups or ())

    monkeypatch.setattr(found, "_wait_placement", wait)
    monkeypatch.setattr(ray_scheduler, "remove_group", removed.append)
    found.know("prep", [2], 3)
    plans = found._by_name  # pyright: ignore[reportPrivateUsage]
    found.set_memory({"lm.prep.1": 768 * MiB})
    found.memory_groups.sized(plans["lm.prep.1"], plans)
    found.set_seats({"lm.prep.2": "prep#1"})
    seated = found.memory_groups.sized(plans["lm.prep.2"], plans)
    assert (seated.group, seated.bundle_index) == ("prep", 1) and seated.options == plans["lm.prep.2"].options
    assert placed == [f"prep.1.mem{768 * MiB}"] and removed == []  # no group of its own for lm.prep.2
    found.set_memory({"lm.prep.0": 768 * MiB})
    found.memory_groups.sized(plans["lm.prep.0"], plans)
    assert removed == []  # lm.prep.2 sits in the role's group: it is kept
    found.memory_groups.forget("lm.prep.2", plans)  # a shrink removes it: nobody is left in the group
    assert removed == ["lm.pg.prep"] and found.memory_groups.released == {"prep"}


def test_a_rebuilt_prime_master_tells_its_scheduler_the_seats_before_anything_is_replaced() -> None:
    from dlu_prime.master.manager import PrimeManager
    from dlu_prime.state.memory import MemoryStateStore
    from dlu_prime.testing.sim_scheduler import SimScheduler

    state = _running(_spec())
    _relaunch(state, "lm.prep.1", 768 * MiB)
    _apply(state, decide(state, ScaleRequested("prep", 3), NOW))
    _apply(state, decide(state, ResizeDue(), NOW))  # lm.prep.2 seated in prep#1, saved
    loaded = JobState.loads(state.dumps())
    assert loaded.actors["lm.prep.2"].seat == "prep#1"
    store = MemoryStateStore()
    store.put("lm", state.dumps(), None)
    clock = _Clock()
    sim = SimScheduler(state.spec, clock, state.actors)
    sim.setup(list(state.actors))
    sim.start(list(state.actors))
    manager = PrimeManager.self_recover(state.spec, sim, store, clock=clock)
    assert manager is not None
    assert sim.seats == {"lm.prep.2": "prep#1"} and sim.memory == {"lm.prep.1": 768 * MiB}


class _Clock:
    def __init__(self) -> None:
        self.now = 1_800_000_000.0

    def __call__(self) -> float:
        return self.now


def test_a_seated_rank_relaunched_again_frees_its_seat_and_the_status_lists_it() -> None:
    from dlu_api.cli.render import statistics_lines

    state = _running(_spec())
    _relaunch(state, "lm.prep.1", 768 * MiB)
    _apply(state, decide(state, ScaleRequested("prep", 3), NOW))
    _apply(state, decide(state, ResizeDue(), NOW))
    state.actors["lm.prep.2"].stage = ActorStage.RUNNING
    state.resize = None
    began = _relaunch(state, "lm.prep.2", 768 * MiB)  # 768 MiB fits no bundle: a group of its own
    assert SetSeats({"lm.prep.2": None}) in began.commands and state.actors["lm.prep.2"].seat is None
    free = "bundle 1 of group prep free, CPU 0.5, memory 512 MiB reserved unused"
    assert (state.events[-1].kind, state.events[-1].message) == (EventKind.BUNDLE_FREE, free)
    assert f"  {free}" in statistics_lines(job_status(state))


def test_in_a_collocation_a_relaunch_takes_the_share_its_bundle_mate_left() -> None:
    spec = spec_from_dict(
        {
            "name": "lm",
            "roles": [
                {
                    "name": "prep",
                    "entrypoint": "m:f",
                    "total": 2,
                    "resources": {"cpu": 0.5, "memory": "512MiB"},
                },
                {
                    "name": "train",
                    "entrypoint": "m:f",
                    "total": 2,
                    "resources": {"cpu": 0.5, "memory": "512MiB"},
                },
            ],
            "collocations": [{"roles": ["prep", "train"]}],
        }
    )
    plan = plan_placement(spec)
    ledger = Ledger(
        {g.name: g for g in plan.groups}, {a.name: a for a in plan.actors}, {"lm.prep.0": 768 * MiB}
    )
    # bundle 0 of prep+train held prep.0 and train.0; with prep.0 gone, train.0 fits 1 GiB there
    assert ledger.choose("lm.train.0", 1024 * MiB) == ("prep+train", 0)
    assert ledger.choose("lm.train.0", 1025 * MiB) is None
