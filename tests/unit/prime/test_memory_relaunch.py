"""The memory relaunch's pure parts: which actor, how much (`autoscale.memory`), how the monitoring
passes count pressure (`autoscale.feed`), its own placement group (`scheduler.placement`), and
the chain of steps with its undo (`master.core.memory_chain`)."""

from __future__ import annotations

import math

import pytest

from dlu_api.spec import spec_from_dict
from dlu_api.vocabulary import ActorStage, EventKind
from dlu_prime.autoscale import memory
from dlu_prime.autoscale.feed import JobStatistics
from dlu_prime.autoscale.memory import MemoryView
from dlu_prime.brain_port.models import RolePlan
from dlu_prime.master.changes import apply_change
from dlu_prime.master.core import memory_chain
from dlu_prime.master.core.commands import Purpose, ReplaceActors, SetMemory, StartActors, SubMasterFailover
from dlu_prime.master.core.decision import Decision
from dlu_prime.master.core.events import Done, RestartRequested
from dlu_prime.master.core.requests import restart_requested
from dlu_prime.master.job_status import job_status
from dlu_prime.master.manager import new_state
from dlu_prime.master.relaunch import RelaunchBegan, RelaunchEnded, RelaunchFailed
from dlu_prime.master.state import JobState
from dlu_prime.scheduler.base import ActorObservation
from dlu_prime.scheduler.placement import memory_actor, plan_placement

pytestmark = pytest.mark.timeout(30)

GiB = 2**30


def view(
    used: float,
    limit: float = 2.0,
    since: float = 0.0,
    samples: int = 3,
    node_memory: int | None = None,
    raised_at: float | None = None,
) -> MemoryView:
    used_bytes = math.ceil(used * GiB)
    limit_bytes = int(limit * GiB)
    return MemoryView(
        "lm.trainer.3",
        "trainer",
        "trainer.3",
        used_bytes,
        limit_bytes,
        since,
        samples,
        node_memory,
        raised_at,
    )


def test_sustained_pressure_gets_its_limit_times_one_and_a_half_with_its_inputs() -> None:
    decision = memory.relaunch(view(1.8), now=30.0, sustain_s=30.0, settle_s=30.0)
    assert decision is not None
    assert (decision.old, decision.new) == (2 * GiB, 3 * GiB)
    assert decision.reason == "trainer.3 at 1.8 GiB of 2 GiB (90%): relaunched with 3 GiB"


@pytest.mark.parametrize(
    ("case", "kw"),
    [
        ("below 90%", {"used": 1.7}),
        ("one sample", {"used": 1.9, "samples": 1}),
        ("not for long", {"used": 1.9, "since": 5.0}),
        ("no limit", {"used": 1.9, "limit": 0.0}),
        ("relaunched lately", {"used": 1.9, "raised_at": 10.0, "since": 11.0}),
        ("measured before its last relaunch", {"used": 1.9, "raised_at": 0.5, "since": 0.0}),
        ("its node holds no more", {"used": 1.9, "node_memory": 2 * GiB}),
    ],
)
def test_nothing_to_do(case: str, kw: dict[str, object]) -> None:
    assert memory.relaunch(view(**kw), now=30.0, sustain_s=30.0, settle_s=30.0) is None, case  # type: ignore[arg-type]


def test_never_more_than_the_node_holds() -> None:
    decision = memory.relaunch(view(1.9, node_memory=int(2.5 * GiB)), 30.0, 30.0, 30.0)
    assert decision is not None and decision.new == int(2.5 * GiB)
    assert decision.reason.endswith("relaunched with 2.5 GiB (its node holds 2.5 GiB)")


def test_settled_since_the_last_relaunch_it_may_be_relaunched_again() -> None:
    decision = memory.relaunch(view(2.9, limit=3.0, since=40.0, raised_at=35.0), 70.0, 30.0, 30.0)
    assert decision is not None and decision.new == int(4.5 * GiB)


def test_the_actor_under_the_most_pressure_goes_first() -> None:
    low = MemoryView("lm.trainer.1", "trainer", "trainer.1", int(1.8 * GiB), 2 * GiB, 0.0, 3)
    high = MemoryView("lm.trainer.2", "trainer", "trainer.2", int(1.95 * GiB), 2 * GiB, 0.0, 3)
    decision = memory.choose([low, high], 30.0, 30.0, 30.0)
    assert decision is not None and decision.actor == "lm.trainer.2"
    assert memory.choose([], 30.0, 30.0, 30.0) is None


def test_a_brain_plan_goes_to_the_role_actor_under_pressure_or_says_why_not() -> None:
    plan = RolePlan(role="trainer", memory_bytes=3 * GiB, algorithm="memory_relaunch", reason="oom", id=4)
    found = memory.for_plan(plan, [view(1.85, samples=1)], 10.0, 30.0)
    assert isinstance(found, memory.MemoryDecision) and found.new == 3 * GiB
    assert found.reason == "trainer.3 at 1.85 GiB of 2 GiB (93%): relaunched with 3 GiB (Brain plan #4: oom)"
    assert memory.for_plan(plan, [], 10.0, 30.0) == (
        "no actor of role trainer is at 90% of its memory limit now"
    )
    full = memory.for_plan(plan, [view(1.9, node_memory=2 * GiB)], 10.0, 30.0)
    assert full == "trainer.3 asks for 2 GiB already and its node holds 2 GiB"


def _spec(memory_limit: str = "1GiB", sub_master: bool = False) -> object:
    role: dict[str, object] = {
        "name": "prep",
        "entrypoint": "pkg.prep:main",
        "total": 2,
        "resources": {"cpu": 0.5, "memory": memory_limit},
    }
    if sub_master:
        role["kind"] = "custom"
        role["sub_master"] = "pkg.sub:Sub"
    return spec_from_dict({"name": "lm", "roles": [role]})


def _running(memory_limit: str = "1GiB") -> JobState:
    state = new_state(_spec(memory_limit))  # type: ignore[arg-type]
    for record in state.actors.values():
        record.stage = ActorStage.RUNNING
    return state


def test_the_feed_counts_consecutive_samples_at_pressure_against_the_actors_own_limit() -> None:
    state = _running()
    stats = JobStatistics(0.0)
    name = "lm.prep.0"

    def sample(t: float, used: float) -> list[MemoryView]:
        seen = ActorObservation(ActorStage.RUNNING, memory_bytes=int(used * GiB), node_memory_bytes=8 * GiB)
        stats.observe(state, {name: seen}, t)
        return stats.memory_views(state)

    assert sample(0.0, 0.95) == [MemoryView(name, "prep", "prep.0", int(0.95 * GiB), GiB, 0.0, 1, 8 * GiB)]
    (high,) = sample(5.0, 0.97)
    assert (high.since, high.samples) == (0.0, 2)
    assert sample(10.0, 0.5) == []  # a sample below: starts again
    sample(15.0, 0.95)
    state.actors[name].memory = 2 * GiB  # relaunched: the same use is no pressure on the new limit
    assert sample(20.0, 0.95) == []
    assert stats.usage()[name].memory_limit_bytes == 2 * GiB
    (again,) = sample(25.0, 1.9)
    assert (again.limit, again.since, again.samples) == (2 * GiB, 25.0, 1)


def test_a_relaunched_actor_gets_a_placement_group_of_its_own_with_the_new_memory() -> None:
    spec = _spec()
    plan = plan_placement(spec).actor("prep", 1)  # type: ignore[arg-type]
    group, sized = memory_actor(spec, plan, int(1.5 * GiB))  # type: ignore[arg-type]
    assert sized.options["memory"] == int(1.5 * GiB) and sized.options["num_cpus"] == 0.5
    assert group.bundles[0].resources == {"CPU": 0.5, "memory": float(int(1.5 * GiB))}
    assert sized.group == group.name == f"prep.1.mem{int(1.5 * GiB)}" and sized.bundle_index == 0
    assert group.pg_name.startswith("lm") and (sized.name, sized.rank) == (plan.name, plan.rank)


def _begin(state: JobState, now: float = 100.0) -> tuple[Decision, memory.MemoryDecision]:
    decision = memory.MemoryDecision("lm.prep.1", "prep", GiB, int(1.5 * GiB), "prep.1 at ...: relaunched")
    return memory_chain.begin(state, decision, now), decision


def _apply(state: JobState, decided: Decision, now: float = 100.0) -> list[str]:
    return [str(e.kind) for change in decided.changes for e in apply_change(state, change, now)]


def test_the_chain_saves_the_override_then_replaces_and_starts_the_actor_counting_nothing() -> None:
    state = _running()
    decided, _ = _begin(state)
    (began,) = decided.changes
    assert isinstance(began, RelaunchBegan)
    assert decided.commands == (
        SetMemory({"lm.prep.1": int(1.5 * GiB)}),
        ReplaceActors(("lm.prep.1",), Purpose.MEMORY),
    )
    assert _apply(state, decided) == [EventKind.MEMORY_RELAUNCH]
    assert state.relaunch is not None and state.actors["lm.prep.1"].memory == int(1.5 * GiB)
    replaced = memory_chain.after(
        state, Done(ReplaceActors(("lm.prep.1",), Purpose.MEMORY), {"lm.prep.1": "n"})
    )
    assert replaced.commands == (StartActors(("lm.prep.1",), Purpose.MEMORY),)
    _apply(state, replaced)
    ended = memory_chain.after(state, Done(StartActors(("lm.prep.1",), Purpose.MEMORY)))
    assert ended.changes == (RelaunchEnded(),)
    assert _apply(state, ended, 101.5) == [EventKind.MEMORY_RELAUNCH_DONE, EventKind.BUNDLE_FREE]
    assert state.relaunch is None and state.relaunch_count == 1
    assert state.events[-2].message == "lm.prep.1 relaunched with 1.5 GiB in 1.50s"
    free = "bundle 1 of group prep free, CPU 0.5, memory 1 GiB reserved unused"  # lm.prep.0 keeps the group
    assert state.events[-1].message == free and job_status(state).free_bundles == [free]
    assert state.actors["lm.prep.1"].restart_count == 0 and state.roles["prep"].restart_count == 0


def test_a_failed_replacement_puts_the_actor_back_with_its_old_memory() -> None:
    state = _running()
    decided, _ = _begin(state)
    _apply(state, decided)
    failed = Done(ReplaceActors(("lm.prep.1",), Purpose.MEMORY), error=RuntimeError("no room for 1.5 GiB"))
    undo = memory_chain.after(state, failed)
    assert isinstance(undo.changes[0], RelaunchFailed)
    assert undo.commands == (SetMemory({"lm.prep.1": GiB}), ReplaceActors(("lm.prep.1",), Purpose.MEMORY))
    assert _apply(state, undo) == [EventKind.MEMORY_RELAUNCH_FAILED]
    assert state.actors["lm.prep.1"].memory is None  # back to its role's
    assert state.relaunch is not None and state.relaunch.error
    again = memory_chain.after(state, failed)  # the old memory could not be had back either
    assert again.changes == (RelaunchEnded("RuntimeError: no room for 1.5 GiB"),)
    assert _apply(state, again) == [EventKind.MEMORY_RELAUNCH_FAILED] and state.relaunch is None


def test_through_a_sub_master_its_call_back_to_restart_the_actor_is_not_counted() -> None:
    state = new_state(_spec(sub_master=True))  # type: ignore[arg-type]
    decided, _ = _begin(state)
    (_, step) = decided.commands
    assert isinstance(step, SubMasterFailover) and step.purpose is Purpose.MEMORY
    assert step.actors == ("lm.prep.1",)
    _apply(state, decided)
    asked = restart_requested(state, RestartRequested(("lm.prep.1",), "the relaunch"))
    _apply(state, asked)
    assert state.actors["lm.prep.1"].restart_count == 0 and state.roles["prep"].restart_count == 0
    other = restart_requested(state, RestartRequested(("lm.prep.0",), "a real fault"))
    _apply(state, other)
    assert state.roles["prep"].restart_count == 1  # anything else is counted as before


def test_a_rebuilt_prime_master_tells_the_scheduler_every_override_and_carries_the_relaunch_on() -> None:
    state = _running()
    assert memory_chain.rebuilt(state) == ()
    decided, _ = _begin(state)
    _apply(state, decided)
    assert memory_chain.rebuilt(state) == (
        SetMemory({"lm.prep.1": int(1.5 * GiB)}),
        ReplaceActors(("lm.prep.1",), Purpose.MEMORY),
    )
    apply_change(state, RelaunchEnded(), 101.0)
    assert memory_chain.rebuilt(state) == (SetMemory({"lm.prep.1": int(1.5 * GiB)}),)
