"""Scaling a simple role by hand: the pure policy (`plan_resize`), the state changes
(`ResizeBegan` / `ResizeEnded` through `apply_change`, clock injected), and the manager running a
saved resize to its end, also after a PrimeMaster restart (SimScheduler, in-memory store)."""

from __future__ import annotations

import pytest
from conftest import build_spec, role

from dlu_api.status import JobStage
from dlu_api.vocabulary import ActorStage, Tier
from dlu_prime.master.changes import FailoverBegan, apply_change
from dlu_prime.master.failover import Recovery
from dlu_prime.master.manager import PrimeManager
from dlu_prime.master.resize import ResizeBegan, ResizeEnded, ScaleError, plan_resize, resizing
from dlu_prime.master.state import MAX_REQUESTS, JobState, RequestOutcome, ResizeRecord, role_size
from dlu_prime.state.memory import MemoryStateStore
from dlu_prime.testing.sim_scheduler import SimScheduler

pytestmark = pytest.mark.timeout(30)

T0 = 1_000.0
W = "job.workers.{}".format


def running_state(**workers: object) -> JobState:
    from dlu_prime.master.lifecycle import new_state

    spec = build_spec([role("trainer", 1), role("workers", 2, is_driver=False, **workers)])
    state = new_state(spec)
    state.stage = JobStage.RUNNING
    return state


def ranks(state: JobState, name: str = "workers") -> list[int]:
    return sorted(a.rank for a in state.actors.values() if a.role == name)


# the policy ------------------------------------------------------------------------------------
def test_growing_adds_the_next_ranks_and_shrinking_stops_the_highest_first() -> None:
    state = running_state()
    grow = plan_resize(state, "workers", 6)
    assert (grow.old_size, grow.new_size, grow.removed) == (2, 6, ())
    assert grow.added == tuple((W(r), r) for r in range(2, 6))
    apply_change(state, ResizeBegan(grow), T0)
    apply_change(state, ResizeEnded(), T0 + 1)
    shrink = plan_resize(state, "workers", 3)
    assert (shrink.old_size, shrink.added, shrink.removed) == (6, (), (W(5), W(4), W(3)))
    same = plan_resize(state, "workers", 6)
    assert (same.added, same.removed) == ((), ())  # the size it has: nothing to do


@pytest.mark.parametrize(
    ("role_name", "size", "words"),
    [
        ("nope", 3, ["no role 'nope'", "trainer, workers"]),
        ("workers", 0, ["size 0", ">= 1"]),
        ("workers", -2, ["size -2", ">= 1"]),
    ],
)
def test_bad_requests_name_the_value_and_the_fix(role_name: str, size: int, words: list[str]) -> None:
    state = running_state()
    before = state.model_dump()
    with pytest.raises(ScaleError) as info:
        plan_resize(state, role_name, size)
    assert all(w in str(info.value) for w in words), str(info.value)
    assert state.model_dump() == before


def test_a_role_the_spec_marks_fixed_or_bounds_is_refused_with_the_field_to_change() -> None:
    with pytest.raises(ScaleError, match=r"not resizable \(resizable: false"):
        plan_resize(running_state(resizable=False), "workers", 3)
    with pytest.raises(ScaleError, match=r"size 5 .* above its max_total=4.*roles\[workers\]\.max_total"):
        plan_resize(running_state(max_total=4), "workers", 5)
    assert plan_resize(running_state(max_total=4), "workers", 4).new_size == 4


def test_an_elastic_role_of_a_fixed_size_is_refused_naming_the_fix() -> None:
    spec = build_spec(
        [{"name": "train", "kind": "elastic", "entrypoint": "train.py", "elastic": {"nnodes": 1}}]
    )
    from dlu_prime.master.lifecycle import new_state

    state = new_state(spec)
    state.stage = JobStage.RUNNING
    with pytest.raises(ScaleError, match=r"fixed size \(nnodes 1\): give elastic.nnodes a range MIN:MAX"):
        plan_resize(state, "train", 2)


def test_a_job_that_is_not_running_or_busy_is_refused() -> None:
    state = running_state()
    state.stage = JobStage.STOPPED
    with pytest.raises(ScaleError, match="STOPPED, not RUNNING"):
        plan_resize(state, "workers", 3)
    state.stage = JobStage.RUNNING
    apply_change(state, ResizeBegan(plan_resize(state, "workers", 3)), T0)
    with pytest.raises(ScaleError, match=r"already resizing role 'workers' \(2 -> 3\)"):
        plan_resize(state, "workers", 4)
    apply_change(state, ResizeEnded(), T0)
    recovery = Recovery(Tier.ROLE, (W(0),), "died", "workers", W(0), None)
    apply_change(state, FailoverBegan(recovery), T0)
    with pytest.raises(ScaleError, match="recovering from a failure"):
        plan_resize(state, "workers", 4)


# the state changes -----------------------------------------------------------------------------
def test_resize_began_saves_the_plan_in_flight_counts_it_and_adds_init_records() -> None:
    state = running_state()
    events = apply_change(state, ResizeBegan(plan_resize(state, "workers", 4)), T0)
    record = state.resize
    assert record is not None
    assert (record.old_size, record.new_size, record.started_at, record.cause) == (2, 4, T0, "dlu scale")
    assert record.added == [W(2), W(3)] and record.removed == []
    assert state.roles["workers"].resize_count == 1
    assert [state.actors[n].stage for n in record.added] == [ActorStage.INIT] * 2
    assert resizing(state) == {W(2), W(3)}
    assert [(e.kind, e.role, e.message) for e in events] == [
        ("resize_started", "workers", "resize 2 -> 4 (dlu scale)")
    ]


def test_resize_ended_drops_the_stopped_actors_and_records_old_new_and_duration() -> None:
    state = running_state()
    apply_change(state, ResizeBegan(plan_resize(state, "workers", 1)), T0)
    assert role_size(state, "workers") == 2  # the surplus actor stays until it is stopped
    (event,) = apply_change(state, ResizeEnded(), T0 + 2.5)
    assert state.resize is None and ranks(state) == [0]
    assert (event.kind, event.role, event.duration_s) == ("resize_done", "workers", 2.5)
    assert event.message == "resize 2 -> 1 (dlu scale) done in 2.50s"
    assert state.to_status().roles[1].size == 1


def test_a_failed_resize_leaves_the_role_at_its_old_size() -> None:
    state = running_state()
    apply_change(state, ResizeBegan(plan_resize(state, "workers", 4)), T0)
    (event,) = apply_change(state, ResizeEnded("SchedulingError: no room"), T0 + 1)
    assert event.kind == "resize_failed" and "role left at 2: SchedulingError: no room" in event.message
    assert ranks(state) == [0, 1] and state.resize is None
    assert state.roles["workers"].resize_count == 1


def test_the_resize_record_survives_a_save_and_load() -> None:
    state = running_state()
    apply_change(state, ResizeBegan(plan_resize(state, "workers", 3)), T0)
    loaded = JobState.loads(state.dumps())
    assert loaded.resize == state.resize and loaded.roles["workers"].resize_count == 1


# the manager running it --------------------------------------------------------------------------
class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> float:
        return self.now


def started(store: MemoryStateStore) -> tuple[PrimeManager, SimScheduler, Clock]:
    spec = build_spec([role("trainer", 1), role("workers", 2, is_driver=False)])
    clock = Clock()
    sim = SimScheduler(spec, clock)
    manager = PrimeManager.create(spec, sim, store, clock=clock)
    manager.prepare()
    manager.start()
    sim.beat()
    manager.monitor_once()
    return manager, sim, clock


def test_grow_then_shrink_touches_only_the_actors_it_adds_or_stops() -> None:
    manager, sim, clock = started(MemoryStateStore())
    manager.resizer.request("workers", 6)
    clock.now += 1
    manager.resizer.resume()
    assert sim.added == [W(r) for r in range(2, 6)] and sim.removed == []
    assert [sim.stages[W(r)] for r in range(6)] == [ActorStage.RUNNING] * 6
    manager.resizer.request("workers", 3)
    manager.resizer.resume()
    assert sim.removed == [W(5), W(4), W(3)]
    assert ranks(manager.state) == [0, 1, 2]
    sim.beat()
    manager.monitor_once()
    assert manager.state.stage is JobStage.RUNNING, manager.state.reason
    done = [e for e in manager.state.events if e.kind == "resize_done"]
    assert [e.message.split(" done")[0] for e in done] == [
        "resize 2 -> 6 (dlu scale)",
        "resize 6 -> 3 (dlu scale)",
    ]
    assert done[0].duration_s == 1.0
    assert manager.state.roles["workers"].resize_count == 2
    assert not any(e.kind in ("died", "failed", "failover_started") for e in manager.state.events)


def test_a_restarted_prime_master_finishes_a_saved_resize_once() -> None:
    store = MemoryStateStore()
    manager, sim, _ = started(store)
    manager.resizer.request("workers", 4)  # saved; this PrimeMaster dies before it acts
    spec = manager.state.spec
    recovered = PrimeManager.self_recover(spec, sim, store, clock=manager.clock)
    assert recovered is not None and recovered.state.resize is not None
    recovered.resizer.resume()
    recovered.resizer.resume()  # nothing left in flight: a no-op
    state = recovered.state
    assert state.resize is None and ranks(state) == [0, 1, 2, 3]
    assert state.roles["workers"].resize_count == 1
    assert [e.kind for e in state.events].count("resize_done") == 1
    assert sim.added == [W(2), W(3)]  # each created once


def test_a_request_id_is_found_in_flight_and_then_answered_from_its_outcome() -> None:
    """Issue 27 defect 5: a `dlu scale` retried after its PrimeMaster died carries the same
    request id; the rebuilt PrimeMaster finds it (in flight, then done), never runs it again."""
    store = MemoryStateStore()
    manager, sim, _ = started(store)
    manager.resizer.request("workers", 4, request_id="r-1")  # saved; this PrimeMaster dies
    recovered = PrimeManager.self_recover(manager.state.spec, sim, store, clock=manager.clock)
    assert recovered is not None
    in_flight = recovered.resizer.known("r-1")
    assert isinstance(in_flight, ResizeRecord) and (in_flight.old_size, in_flight.new_size) == (2, 4)
    assert recovered.resizer.known("r-other") is None
    recovered.resizer.resume()
    outcome = recovered.resizer.known("r-1")
    assert isinstance(outcome, RequestOutcome) and not outcome.failed
    assert outcome.message.startswith("resize 2 -> 4 (dlu scale) done")
    stored = store.get(manager.state.job)
    assert stored is not None and JobState.loads(stored.data).requests["r-1"] == outcome
    assert recovered.state.roles["workers"].resize_count == 1 and sim.added == [W(2), W(3)]


def test_request_outcomes_are_bounded() -> None:
    manager, _, _ = started(MemoryStateStore())
    for n in range(MAX_REQUESTS + 5):
        manager.resizer.request("workers", 3 if n % 2 == 0 else 2, request_id=f"r-{n}")
        manager.resizer.resume()
    kept = manager.state.requests
    assert len(kept) == MAX_REQUESTS and "r-0" not in kept and f"r-{MAX_REQUESTS + 4}" in kept


def test_a_surplus_actor_is_never_judged_while_it_is_stopped() -> None:
    manager, sim, _ = started(MemoryStateStore())
    manager.resizer.request("workers", 1)
    sim.kill(W(1), "stopped by the resize")
    manager.monitor_once()  # the in-flight resize's actors are not polled
    assert manager.state.failover is None
    manager.resizer.resume()
    sim.beat()
    manager.monitor_once()
    assert manager.state.stage is JobStage.RUNNING
    assert not any(e.kind == "died" for e in manager.state.events)


def test_a_collocated_role_is_refused_naming_the_collocation() -> None:
    from dlu_prime.master.lifecycle import new_state

    spec = build_spec(
        [role("trainer", 2), role("workers", 2, is_driver=False)],
        collocations=[{"roles": ["trainer", "workers"]}],
    )
    state = new_state(spec)
    state.stage = JobStage.RUNNING
    with pytest.raises(ScaleError, match=r"collocated \(trainer, workers\).*out of `collocations`"):
        plan_resize(state, "workers", 3)


def test_a_max_total_below_total_is_a_spec_problem_naming_the_fix() -> None:
    from dlu_api.errors import SpecError

    with pytest.raises(SpecError, match=r"max_total.*below total=2.*set max_total to 2 or more"):
        build_spec([role("trainer", 1), role("workers", 2, is_driver=False, max_total=1)])


def test_shards_a_stopped_actor_held_go_back_to_todo_and_are_told_once() -> None:
    """Dynamic sharding across a shrink: the shards the surplus actors held return to the queue's
    todo (nothing lost), after they are stopped; a retried resume hands nothing back twice."""
    manager, sim, _ = started(MemoryStateStore())
    manager.registry.register_channel("data", "shards", "job.shards.data")
    manager.registry.register_channel("feed", "channel", "job.channel.feed")
    manager.resizer.request("workers", 4)
    manager.resizer.resume()
    sim.held_shards = {"data": {W(3): [7, 9], W(2): [4], W(0): [1]}}
    manager.resizer.request("workers", 2)
    manager.resizer.resume()
    assert sim.held_shards == {"data": {W(0): [1]}}  # the kept worker keeps its shard
    (told,) = [e.message for e in manager.state.events if e.kind == "shards_requeued"]
    assert told == "shard queue 'data': shards [7, 9, 4] of stopped actors back in todo"
    manager.resizer.resume()
    assert [e.kind for e in manager.state.events].count("shards_requeued") == 1
