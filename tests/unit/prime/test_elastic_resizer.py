"""The PrimeManager driving elastic resizes with a fake cluster (no Ray): a node lost for good
becomes one saved resize that the loop carries out (no failover, no count), growth onto a node
Ray placed, and a PrimeMaster restarted half way through a resize finishing it once."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest
from conftest import FakeClock, FakeScheduler, RecordingStore

from dlu_api.spec import spec_from_dict
from dlu_api.spec.models import JobSpec
from dlu_api.status import JobStage
from dlu_api.vocabulary import ActorStage
from dlu_prime.master.manager import PrimeManager

pytestmark = pytest.mark.timeout(30)

T = "job.trainer.{}".format


def elastic_spec(**elastic: object) -> JobSpec:
    return spec_from_dict(
        {
            "name": "job",
            "device_type": "CPU",
            "device_per_node": 0,
            "health": {"monitor_interval_s": 0.1},
            "roles": [
                {
                    "name": "trainer",
                    "kind": "elastic",
                    "entrypoint": "train.py",
                    "elastic": {"nnodes": "1:2", "nproc_per_node": 1, "replace_timeout_s": 5, **elastic},
                }
            ],
        }
    )


class ElasticFake(FakeScheduler):
    """The fake cluster plus what an elastic resize asks of a scheduler and of the SubMaster."""

    def __init__(self, spec: JobSpec, store: RecordingStore, clock: FakeClock) -> None:
        super().__init__(spec, store, clock)
        self.placed: set[int] = {0, 1}
        self.members: list[tuple[list[int], list[int]]] = []
        self.dropped: list[str] = []
        self.added: list[str] = []
        self.checked: list[list[int]] = []

    def prepare(self) -> dict[str, str | None]:
        self._enter("prepare")
        return {n: a.node_id for n, a in self.actors.items() if a.rank < 0 or a.rank in self.placed}

    def placed_nodes(self, role: str, nodes: Sequence[int], wait_s: float = 0.0) -> list[int]:
        return sorted(k for k in nodes if k in self.placed)

    def drop_actors(self, names: Sequence[str]) -> None:
        self.dropped.extend(names)

    def add_actors(self, role: str, ranks: Sequence[int], world_size: int) -> dict[str, str | None]:
        names = [T(r) for r in ranks]
        self.added.extend(names)
        for name in names:
            self.actors[name].stage = ActorStage.READY
            self.actors[name].unavailable = False
            self.actors[name].node_id = f"node-{name[-1]}-new"
        return {name: self.actors[name].node_id for name in names}

    def call(self, name: str, method: str, *args: Any, timeout_s: float | None = None) -> Any:
        if method == "check_nodes":
            self._enter("call", (name, method))
            self.checked.append(list(args[0]))
            return None
        if method == "resize_members":
            self._enter("call", (name, method))
            ranks, new_ranks, _ = args
            self.members.append((list(ranks), list(new_ranks)))
            for rank in new_ranks:
                self.actors[T(rank)].stage = ActorStage.RUNNING
            return len(ranks)
        return super().call(name, method, *args, timeout_s=timeout_s)


def running(
    store: RecordingStore, clock: FakeClock, placed: set[int], **elastic: object
) -> tuple[PrimeManager, ElasticFake]:
    spec = elastic_spec(**elastic)
    fake = ElasticFake(spec, store, clock)
    fake.placed = placed
    manager = PrimeManager.create(spec, fake, store, clock=clock)
    fake.manager = manager
    manager.prepare()
    manager.start()
    for name in manager.state.actors:
        fake.actors[name].stage = ActorStage.RUNNING
    manager.monitor_once()
    return manager, fake


def test_a_node_marked_dead_is_one_saved_resize_then_training_re_forms_in_place() -> None:
    store, clock = RecordingStore(), FakeClock()
    manager, fake = running(store, clock, {0, 1})
    fake.set(T(1), {"unavailable": True})
    fake.dead = {"node-1"}
    manager.monitor_once()  # seen gone, node dead: the shrink is saved, nothing acted on yet
    stored = store.state("job")
    assert stored is not None and stored.resize is not None
    assert (stored.resize.removed, stored.resize.nodes, stored.resize.cause.startswith("node lost")) == (
        [T(1)],
        1,
        True,
    )
    assert fake.dropped == [] and stored.failover is None
    manager.resizer.resume()
    assert fake.dropped == [T(1)] and fake.members == [([0], [])]
    state = manager.state
    assert state.resize is None and sorted(a.rank for a in state.actors.values() if a.rank >= 0) == [0]
    role = state.roles["trainer"]
    assert (role.resize_count, role.restart_count, role.inplace_restart_count) == (1, 0, 0)
    assert state.stage is JobStage.RUNNING and state.failover is None
    assert not [e for e in state.events if e.kind in ("died", "unavailable", "failover_started")]
    manager.monitor_once()
    assert manager.state.failover is None and manager.state.roles["trainer"].resize_count == 1


def test_an_unplaceable_node_waits_replace_timeout_s_before_it_counts_as_lost() -> None:
    store, clock = RecordingStore(), FakeClock()
    manager, fake = running(store, clock, {0, 1}, replace_timeout_s=5)
    fake.set(T(1), {"unavailable": True})
    manager.monitor_once()
    clock.advance(4)
    manager.monitor_once()
    assert manager.state.resize is None and manager.state.failover is None  # held: Ray may re-place it
    clock.advance(2)
    manager.monitor_once()
    assert manager.state.resize is not None and "unplaceable for 5s" in manager.state.resize.cause


def test_starts_with_the_placed_node_and_grows_when_the_other_is_placed() -> None:
    store, clock = RecordingStore(), FakeClock()
    manager, fake = running(store, clock, {0}, resize_interval_s=10)
    assert sorted(a.rank for a in manager.state.actors.values() if a.rank >= 0) == [0]
    assert any(e.kind == "elastic_start" for e in manager.state.events)
    manager.elastic.tick(clock())
    assert manager.state.resize is None  # node 1 not placed yet
    fake.placed = {0, 1}
    manager.elastic.tick(clock())
    assert manager.state.resize is not None and manager.state.resize.added == [T(1)]
    manager.resizer.resume()
    assert fake.added == [T(1)] and fake.checked == [[1]] and fake.members == [([0, 1], [1])]
    status = manager.status().roles[0]
    assert (status.nodes, status.pending_nodes, status.resize_count) == (2, 0, 1)


def test_nothing_happening_means_no_resize_over_many_intervals() -> None:
    store, clock = RecordingStore(), FakeClock()
    manager, fake = running(store, clock, {0, 1}, resize_interval_s=1, replace_timeout_s=1)
    for _ in range(200):
        clock.advance(0.5)
        manager.resizer.resume()
        manager.elastic.tick(clock())
        manager.monitor_once()
    assert manager.state.roles["trainer"].resize_count == 0
    assert not [e for e in manager.state.events if e.kind.startswith("resize")]
    assert fake.members == []


def test_a_prime_master_restarted_mid_resize_finishes_it_once() -> None:
    store, clock = RecordingStore(), FakeClock()
    manager, fake = running(store, clock, {0, 1})
    fake.set(T(1), {"unavailable": True})
    fake.dead = {"node-1"}
    manager.monitor_once()  # saved; this PrimeMaster dies before acting on it
    recovered = PrimeManager.self_recover(manager.state.spec, fake, store, clock=clock)
    assert recovered is not None and recovered.state.resize is not None
    fake.manager = recovered
    recovered.resizer.resume()
    assert fake.dropped == [T(1)] and fake.members == [([0], [])]
    role = recovered.state.roles["trainer"]
    assert role.resize_count == 1 and recovered.state.resize is None
    assert [e.kind for e in recovered.state.events].count("resize_done") == 1


class Died(BaseException):
    """The PrimeMaster's process ends here (nothing after it runs)."""


def test_a_prime_master_killed_after_the_node_check_does_not_check_again() -> None:
    """Issue 27 defect 5: after a PrimeMaster died mid-resize, its successor ran the new node's
    check a second time (logged twice)."""
    store, clock = RecordingStore(), FakeClock()
    manager, fake = running(store, clock, {0}, resize_interval_s=0)
    fake.placed = {0, 1}
    manager.elastic.tick(clock())
    original = fake.call

    def dies_at_re_forming(name: str, method: str, *args: Any, timeout_s: float | None = None) -> Any:
        if method == "resize_members":
            raise Died
        return original(name, method, *args, timeout_s=timeout_s)

    fake.call = dies_at_re_forming  # type: ignore[method-assign]
    with pytest.raises(Died):
        manager.resizer.resume()
    assert fake.checked == [[1]]
    fake.call = original  # type: ignore[method-assign]
    recovered = PrimeManager.self_recover(manager.state.spec, fake, store, clock=clock)
    assert recovered is not None and recovered.state.resize is not None
    fake.manager = recovered
    recovered.resizer.resume()
    assert fake.checked == [[1]] and fake.members == [([0, 1], [1])]
    assert [e.kind for e in recovered.state.events].count("resize_done") == 1


def test_dlu_scale_to_the_size_it_has_keeps_that_size() -> None:
    store, clock = RecordingStore(), FakeClock()
    manager, fake = running(store, clock, {0}, resize_interval_s=0)
    plan = manager.resizer.request("trainer", 1)
    assert (plan.added, plan.removed) == ((), ()) and manager.state.resize is None
    assert manager.state.roles["trainer"].target_nodes == 1
    fake.placed = {0, 1}
    manager.elastic.tick(clock.advance(100))
    assert manager.state.resize is None  # node 1 is placeable, but the role was asked to keep 1
    assert manager.status().roles[0].pending_nodes == 0
    manager.resizer.request("trainer", 2)
    manager.resizer.resume()
    assert fake.members == [([0, 1], [1])] and manager.state.roles["trainer"].target_nodes == 2


def test_below_min_waits_for_capacity_then_stops_counting_the_lost_node_once() -> None:
    store, clock = RecordingStore(), FakeClock()
    manager, fake = running(store, clock, {0, 1}, nnodes="2:3", replace_timeout_s=5)
    fake.set(T(1), {"unavailable": True})
    fake.dead = {"node-1"}
    manager.monitor_once()
    clock.advance(4)
    manager.monitor_once()  # waiting for capacity: no resize, no failover, still running
    state = manager.state
    assert (state.stage, state.resize, state.failover) == (JobStage.RUNNING, None, None)
    waits = [e.message for e in state.events if e.kind == "elastic_below_min"]
    assert len(waits) == 1 and "has 1 node(s) after losing node 1 (Ray marked it dead)" in waits[0]
    clock.advance(2)
    manager.monitor_once()
    state = manager.state
    assert (state.stage, state.exit_code) == (JobStage.STOPPED, 1)
    assert "needs at least 2 (nnodes 2:3); no node could be placed in 5s" in state.reason
    role = state.roles["trainer"]
    assert (role.restart_count, role.inplace_restart_count, role.resize_count) == (0, 0, 0)
    assert (state.actors[T(1)].total_failures, state.actors[T(0)].total_failures) == (1, 0)
    assert state.job_restart_count == 0 and state.actors[T(0)].restart_count == 0
    assert not [e for e in state.events if e.kind.startswith("failover")]
    assert state.first_failure is not None and state.first_failure.actor == T(1)


def test_below_min_a_node_placed_while_waiting_joins_in_one_resize() -> None:
    store, clock = RecordingStore(), FakeClock()
    manager, fake = running(store, clock, {0, 1}, nnodes="2:3", replace_timeout_s=5)
    fake.set(T(1), {"unavailable": True})
    fake.dead = {"node-1"}
    manager.monitor_once()
    assert manager.state.resize is None
    fake.placed = {0, 1, 2}  # capacity came back: node 2's group placed
    clock.advance(2)
    manager.elastic.tick(clock())  # the loop's order: no growth that still counts the lost node
    assert manager.state.resize is None
    manager.monitor_once()
    record = manager.state.resize
    assert record is not None and (record.removed, record.added, record.nodes) == ([T(1)], [T(2)], 2)
    assert record.cause == "node lost: node 1, Ray marked it dead; node(s) 2 placed"
    manager.resizer.resume()
    assert fake.dropped == [T(1)] and fake.added == [T(2)] and fake.members == [([0, 2], [2])]
    state = manager.state
    assert state.stage is JobStage.RUNNING and sorted(
        a.rank for a in state.actors.values() if a.rank >= 0
    ) == [0, 2]
    assert (state.roles["trainer"].restart_count, state.roles["trainer"].resize_count) == (0, 1)


def test_below_min_a_lost_node_ray_rebuilds_meanwhile_goes_to_the_failover_ladder() -> None:
    store, clock = RecordingStore(), FakeClock()
    manager, fake = running(store, clock, {0, 1}, nnodes="2:3", replace_timeout_s=5)
    fake.set(T(1), {"unavailable": True})
    fake.dead = {"node-1"}
    manager.monitor_once()
    assert manager.state.failover is None and manager.state.resize is None  # waiting below MIN
    # capacity came back where the lost node's group was: Ray placed it again and rebuilt the actor
    fake.set(
        T(1), {"unavailable": False, "stage": ActorStage.INIT, "reconstructed": True, "node_id": "node-9"}
    )
    fake.dead = set()
    clock.advance(2)
    manager.monitor_once()
    state = manager.state
    assert state.stage is JobStage.RUNNING and state.resize is None
    started = [e for e in state.events if e.kind == "failover_started"]
    assert len(started) == 1 and started[0].actor == T(1) and started[0].tier == "role"
    clock.advance(10)  # long past the wait: nothing is judged below MIN any more
    manager.monitor_once()
    assert manager.state.stage is JobStage.RUNNING
    assert not [e for e in manager.state.events if e.kind == "died"]


def test_a_resize_waits_for_a_sub_master_lost_with_the_node_and_never_escalates() -> None:
    """Defect 4: the node lost also hosted the ElasticMaster. Ray is still rebuilding it when the
    resize would call it: the resize waits (stays in flight, no resize_failed), the failover
    ladder sets the SubMaster up again as the loss's effect (joined, not counted), then the resize
    re-forms the survivors: one resize, no role failover, no job restart."""
    store, clock = RecordingStore(), FakeClock()
    manager, fake = running(store, clock, {0, 1})
    sub = "job.trainer.submaster"
    manager.state.actors[sub].node_id = "node-1"  # it lives on the node about to be lost
    fake.actors[sub].node_id = "node-1"
    fake.set(T(1), {"unavailable": True})
    fake.dead = {"node-1"}
    manager.monitor_once()  # the shrink is saved; the SubMaster still answers from its old process
    assert manager.state.resize is not None
    fake.set(sub, {"stage": None, "unavailable": True, "error": "Ray is restarting it"})
    manager.resizer.resume()  # the SubMaster is being rebuilt: the resize waits
    state = manager.state
    assert state.resize is not None and fake.members == []
    assert [e.kind for e in state.events if e.kind.startswith("resize")] == [
        "resize_started",
        "resize_waiting",
    ]
    fake.set(sub, {"stage": ActorStage.INIT, "unavailable": False, "reconstructed": True, "error": None})
    manager.monitor_once()  # the ladder: the SubMaster rebuilt, set up again, joined to the loss
    assert [c.names for c in fake.calls_to("restart")] == [(sub,)]
    manager.resizer.resume()
    state = manager.state
    assert state.resize is None and fake.members == [([0], [])]
    role = state.roles["trainer"]
    assert (role.resize_count, role.restart_count, role.sub_master_restart_count) == (1, 0, 0)
    assert state.job_restart_count == 0 and state.stage is JobStage.RUNNING
    kinds = [e.kind for e in state.events]
    assert "resize_failed" not in kinds and "failover_escalated" not in kinds
    assert "failover_started" not in kinds and kinds.count("failover_joined") == 1
    assert not [e for e in state.events if e.kind == "resize_ended" and "fail" in e.message]
