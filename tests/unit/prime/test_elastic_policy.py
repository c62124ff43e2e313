"""Elastic roles with nnodes MIN:MAX: the pure rules (start, shrink, grow, `dlu scale` by node
count), the state changes they lead to, and the per-node placement plan. Clock injected."""

from __future__ import annotations

import pytest

from dlu_api.errors import SpecError
from dlu_api.spec import spec_from_dict
from dlu_api.status import JobStage
from dlu_api.vocabulary import Tier
from dlu_prime.master.changes import apply_change
from dlu_prime.master.elastic_policy import (
    forgiven_by_loss,
    grow_nodes,
    judge_loss,
    missing_nodes,
    plan_elastic_scale,
    role_nodes,
    target_nodes,
)
from dlu_prime.master.elastic_resize import unplaced_elastic
from dlu_prime.master.lifecycle import new_state
from dlu_prime.master.resize import FellBelowMin, ResizeBegan, ResizeEnded, ScaleError, plan_resize
from dlu_prime.master.state import FailoverRecord, JobState
from dlu_prime.preflight import job_demand
from dlu_prime.scheduler.node_groups import StartKind, missing_message, start_verdict
from dlu_prime.scheduler.placement import plan_placement

pytestmark = pytest.mark.timeout(30)

T0 = 1_000.0
T = "job.trainer.{}".format


def spec_of(nnodes: str = "1:3", nproc: int = 2, **elastic: object) -> dict[str, object]:
    return {
        "name": "job",
        "device_type": "CPU",
        "device_per_node": 0,
        "roles": [
            {
                "name": "trainer",
                "kind": "elastic",
                "entrypoint": "train.py",
                "resources": {"cpu": 1},
                "elastic": {"nnodes": nnodes, "nproc_per_node": nproc, **elastic},
            }
        ],
    }


def running(nodes: list[int], nnodes: str = "1:3", nproc: int = 2, **elastic: object) -> JobState:
    """A running job whose role has exactly these nodes (each on Ray node 'ray-K')."""
    state = new_state(spec_from_dict(spec_of(nnodes, nproc, **elastic)))
    state.stage = JobStage.RUNNING
    for name, record in list(state.actors.items()):
        if record.rank < 0:
            continue
        if record.rank // nproc not in nodes:
            del state.actors[name]
        else:
            record.node_id = f"ray-{record.rank // nproc}"
    return state


# spec ------------------------------------------------------------------------------------------
def test_the_new_knobs_have_defaults_and_bad_values_name_the_field() -> None:
    elastic = spec_from_dict(spec_of()).roles[0].elastic
    assert elastic is not None
    assert (elastic.start_timeout_s, elastic.replace_timeout_s, elastic.resize_interval_s) == (
        60.0,
        30.0,
        60.0,
    )
    with pytest.raises(SpecError, match=r"roles\[trainer\]\.elastic\.start_timeout_s.*greater than 0"):
        spec_from_dict(spec_of(start_timeout_s=0))
    with pytest.raises(SpecError, match=r"roles\[trainer\]\.elastic\.replace_timeout_s"):
        spec_from_dict(spec_of(replace_timeout_s=-1))
    with pytest.raises(SpecError, match=r"elastic\.nnodes.*1 <= MIN <= MAX"):
        spec_from_dict(spec_of(nnodes="3:2"))
    with pytest.raises(SpecError, match=r"elastic\.nnodes.*1 <= MIN <= MAX"):
        spec_from_dict(spec_of(nnodes="0:2"))


# placement -------------------------------------------------------------------------------------
def test_a_min_max_role_gets_one_placement_group_per_node() -> None:
    plan = plan_placement(spec_from_dict(spec_of("1:3", 2)))
    assert [g.name for g in plan.groups] == ["trainer.node0", "trainer.node1", "trainer.node2"]
    assert all(len(g.bundles) == 1 and g.bundles[0].resources == {"CPU": 2.0} for g in plan.groups)
    assert [(a.rank, a.group, a.bundle_index) for a in plan.actors][:3] == [
        (0, "trainer.node0", 0),
        (1, "trainer.node0", 0),
        (2, "trainer.node1", 0),
    ]
    fixed = plan_placement(spec_from_dict(spec_of("2", 2)))
    assert [g.name for g in fixed.groups] == ["trainer"] and len(fixed.groups[0].bundles) == 2


def test_preflight_asks_for_min_nodes_only() -> None:
    demand = job_demand(spec_from_dict(spec_of("1:3", 2)))
    assert demand.by_source["CPU"]["roles[trainer]"] == 2.0  # 1 node x 2 ranks x 1 CPU
    assert demand.bundle["CPU"][0] == 2.0


# start -----------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("placed", "elapsed", "kind", "nodes"),
    [
        ([0, 1, 2], 0.0, StartKind.START, (0, 1, 2)),  # MAX at once: no wait
        ([0], 10.0, StartKind.WAIT, (0,)),  # MIN reached, MAX may still come
        ([], 10.0, StartKind.WAIT, ()),  # below MIN: keeps waiting until the timeout
        ([2, 0], 60.0, StartKind.START, (0, 2)),  # at the timeout: with what it has
    ],
)
def test_start_verdict(placed: list[int], elapsed: float, kind: StartKind, nodes: tuple[int, ...]) -> None:
    verdict = start_verdict("trainer", placed, 1, 3, elapsed, 60.0)
    assert (verdict.kind, verdict.nodes) == (kind, nodes)


def test_below_min_at_the_timeout_fails_naming_nodes_got_and_needed() -> None:
    verdict = start_verdict("trainer", [0], 2, 3, 60.0, 60.0)
    assert verdict.kind is StartKind.FAIL
    assert "got 1 node(s) placed in 60s (elastic.start_timeout_s) but needs at least 2" in verdict.reason


def test_what_one_node_needs_leaves_out_the_resources_of_placed_bundles() -> None:
    group = plan_placement(spec_from_dict(spec_of("1:3", 2))).groups[0]
    available = {"CPU": 3.5, "bundle_group_0_ab12": 999.999, "CPU_group_ab12": 1.0, "slot": 1.0}
    message = missing_message(group, available)
    assert message == "each node of the role needs {CPU 2} and the cluster has CPU 3.5, slot 1 available"


def test_unplaced_nodes_leave_the_state_with_one_event() -> None:
    state = new_state(spec_from_dict(spec_of("1:3", 2)))
    placed = {T(0): "a", T(1): "a", "job.trainer.submaster": "h"}
    changes = unplaced_elastic(state, placed)
    assert len(changes) == 1 and set(changes[0].names) == {T(2), T(3), T(4), T(5)}
    events = apply_change(state, changes[0], T0)
    assert sorted(role_nodes(state, "trainer")) == [0]
    assert "starts with 1 of 3 node(s)" in events[0].message
    status = state.to_status().roles[0]
    assert (status.nodes, status.min_nodes, status.max_nodes, status.pending_nodes) == (1, 1, 3, 2)
    assert unplaced_elastic(state, {T(0): "a", T(1): "a"}) == []


# shrink ----------------------------------------------------------------------------------------
def test_a_node_ray_marked_dead_is_lost_at_once_and_shrinks_to_the_survivors() -> None:
    state = running([0, 1])
    verdict = judge_loss(state, "trainer", {T(2): T0, T(3): T0}, {"ray-1"}, T0, has_extension=False)
    assert verdict.lost == (1,) and verdict.shrink is not None
    assert (verdict.shrink.old_size, verdict.shrink.new_size, verdict.shrink.nodes) == (2, 1, 1)
    assert set(verdict.shrink.removed) == {T(2), T(3)} and verdict.shrink.added == ()
    assert verdict.hold == {T(2), T(3)}  # their failures are the resize's, not the ladder's


def test_an_unplaceable_node_is_held_until_replace_timeout_then_lost() -> None:
    state = running([0, 1], replace_timeout_s=30)
    waiting = judge_loss(state, "trainer", {T(2): T0}, set(), T0 + 29, has_extension=False)
    assert waiting.shrink is None and waiting.hold == {T(2)} and waiting.lost == ()
    lost = judge_loss(state, "trainer", {T(2): T0}, set(), T0 + 31, has_extension=False)
    assert lost.shrink is not None and lost.lost == (1,)


def test_below_min_waits_up_to_the_timeout_then_stops_naming_nodes_had_and_needed() -> None:
    state = running([0, 1], nnodes="2:3")
    held = judge_loss(state, "trainer", {T(2): T0}, {"ray-1"}, T0 + 1, has_extension=False)
    assert held.shrink is None and held.stop is None and held.hold == {T(2)}  # waits for capacity
    assert held.below_min is not None and "waiting up to 30s (elastic.replace_timeout_s)" in held.below_min
    over = judge_loss(state, "trainer", {T(2): T0, T(3): T0}, {"ray-1"}, T0 + 31, has_extension=False)
    assert over.shrink is None and over.hold == {T(2), T(3)}  # not the ladder's: nothing to restart
    assert over.stop is not None and over.culprit == T(2) and over.lost == (1,)
    assert over.stop == (
        "role trainer has 1 node(s) after losing node 1 (Ray marked it dead) and needs at least 2 "
        "(nnodes 2:3); no node could be placed in 30s (elastic.replace_timeout_s)"
    )


def test_below_min_after_an_unplaceable_node_stops_at_once_naming_the_timeout() -> None:
    state = running([0, 1], nnodes="2:3", replace_timeout_s=5)
    assert judge_loss(state, "trainer", {T(3): T0}, set(), T0 + 4, has_extension=False).below_min is None
    over = judge_loss(state, "trainer", {T(3): T0}, set(), T0 + 6, has_extension=False)
    assert over.culprit == T(3) and over.stop is not None and "(unplaceable for 5s)" in over.stop


def test_below_min_a_node_ray_placed_meanwhile_joins_in_the_same_resize() -> None:
    state = running([0, 1], nnodes="2:3")
    verdict = judge_loss(state, "trainer", {T(2): T0}, {"ray-1"}, T0 + 3, has_extension=False, placed=[2])
    assert verdict.stop is None and verdict.shrink is not None and verdict.lost == (1,)
    plan = verdict.shrink
    assert (plan.old_size, plan.new_size, plan.nodes) == (2, 2, 2)
    assert set(plan.removed) == {T(2), T(3)} and plan.added == ((T(4), 4), (T(5), 5))
    late = judge_loss(state, "trainer", {T(2): T0}, {"ray-1"}, T0 + 31, has_extension=False, placed=[2])
    assert late.shrink is not None and late.stop is None  # capacity there at the end: no stop
    kept = running([0, 1], nnodes="2:3")
    kept.roles["trainer"].target_nodes = 2  # `dlu scale` keeps 2: room for one node only
    assert judge_loss(kept, "trainer", {T(2): T0}, {"ray-1"}, T0, has_extension=False, placed=[2]).shrink


def test_below_min_while_a_failover_is_in_flight_goes_to_the_ladder_after_the_timeout() -> None:
    state = running([0, 1], nnodes="2:3")
    state.failover = FailoverRecord(tier=Tier.ROLE, role="trainer", actors=[T(0)], reason="x", started_at=T0)
    held = judge_loss(state, "trainer", {T(2): T0}, {"ray-1"}, T0 + 1, has_extension=False)
    assert held.hold == {T(2)} and held.stop is None
    over = judge_loss(state, "trainer", {T(2): T0}, {"ray-1"}, T0 + 31, has_extension=False)
    assert over.hold == frozenset() and over.stop is None and over.shrink is None


def test_falling_below_min_counts_the_lost_node_once_and_forgives_what_it_caused() -> None:
    state = running([0, 1], nnodes="2:3")
    state.roles["trainer"].inplace_restart_count = 1
    events = apply_change(state, FellBelowMin("trainer", T(2), "role trainer has 1 node(s) ...", 1), T0)
    assert [(e.kind, e.actor, e.node_id) for e in events] == [("died", T(2), "ray-1")]
    assert state.actors[T(2)].total_failures == 1 and state.actors[T(0)].total_failures == 0
    role = state.roles["trainer"]
    assert (role.inplace_restart_count, role.restart_count) == (0, 0)
    assert state.first_failure is not None and state.first_failure.actor == T(2)


def test_with_an_extension_a_lost_node_is_relaunched_not_shrunk() -> None:
    state = running([0, 1])
    verdict = judge_loss(state, "trainer", {T(2): T0}, {"ray-1"}, T0, has_extension=True)
    assert verdict == type(verdict)()


def test_a_node_loss_is_one_counted_resize_and_the_actors_leave() -> None:
    state = running([0, 1])
    verdict = judge_loss(state, "trainer", {T(2): T0}, {"ray-1"}, T0, has_extension=False)
    assert verdict.shrink is not None
    apply_change(state, ResizeBegan(verdict.shrink, "node lost: node 1"), T0)
    assert state.roles["trainer"].resize_count == 1 and state.roles["trainer"].target_nodes is None
    events = apply_change(state, ResizeEnded(), T0 + 1.5)
    assert sorted(role_nodes(state, "trainer")) == [0]
    assert events[-1].kind == "resize_done" and events[-1].duration_s == pytest.approx(1.5)
    assert "resize 2 -> 1 node(s), world 4 -> 2 (node lost: node 1)" in events[-1].message
    assert state.roles["trainer"].restart_count == 0 and state.roles["trainer"].last_resize_at == T0 + 1.5


# grow ------------------------------------------------------------------------------------------
def test_growth_onto_placed_nodes_at_most_once_per_interval() -> None:
    state = running([0], resize_interval_s=60)
    assert missing_nodes(state, "trainer") == [1, 2]
    plan = grow_nodes(state, "trainer", [2], T0, None)
    assert plan is not None and plan.added == ((T(4), 4), (T(5), 5)) and plan.nodes == 2
    assert grow_nodes(state, "trainer", [2], T0 + 59, T0) is None  # too soon after the last one
    assert grow_nodes(state, "trainer", [2], T0 + 61, T0) is not None
    assert grow_nodes(state, "trainer", [], T0 + 61, T0) is None  # nothing placed


def test_no_growth_while_busy_or_at_the_target() -> None:
    state = running([0, 1, 2])
    assert missing_nodes(state, "trainer") == [] and grow_nodes(state, "trainer", [0, 1, 2], T0, None) is None
    busy = running([0])
    busy.stage = JobStage.STOPPING
    assert grow_nodes(busy, "trainer", [1], T0, None) is None


# dlu scale -------------------------------------------------------------------------------------
def test_dlu_scale_sets_a_node_count_within_min_max() -> None:
    state = running([0, 1, 2])
    down = plan_resize(state, "trainer", 1)
    assert (down.old_size, down.new_size, down.nodes) == (3, 1, 1)
    assert down.removed == (T(5), T(4), T(3), T(2))  # highest nodes first
    apply_change(state, ResizeBegan(down), T0)
    apply_change(state, ResizeEnded(), T0 + 1)
    assert target_nodes(state, "trainer") == 1 and missing_nodes(state, "trainer") == []
    assert grow_nodes(state, "trainer", [1, 2], T0 + 1e6, T0) is None  # the role keeps its new size
    up = plan_elastic_scale(state, "trainer", 2)
    assert up.added == ((T(2), 2), (T(3), 3))


@pytest.mark.parametrize("size", [0, 4, -1])
def test_dlu_scale_outside_min_max_is_refused_naming_the_range(size: int) -> None:
    with pytest.raises(
        ScaleError, match=rf"size {size} for elastic role 'trainer' .* outside its nnodes 1:3.* from 1 to 3"
    ):
        plan_resize(running([0]), "trainer", size)


def test_dlu_scale_of_an_elastic_role_marked_not_resizable_is_refused() -> None:
    data = spec_of()
    data["roles"][0]["resizable"] = False  # type: ignore[index]
    state = new_state(spec_from_dict(data))
    state.stage = JobStage.RUNNING
    with pytest.raises(ScaleError, match=r"not resizable \(resizable: false"):
        plan_resize(state, "trainer", 2)


def test_in_place_restarts_the_node_loss_caused_are_not_counted() -> None:
    state = running([0, 1])
    state.roles["trainer"].inplace_restart_count = 2
    state.record("inplace_restart", "long before: Connection reset by peer", role="trainer", at=T0 - 100)
    state.record("inplace_restart", "peer's node died: Connection reset by peer", role="trainer", at=T0 - 0.5)
    lost = [T(2), T(3)]
    assert forgiven_by_loss(state, "trainer", T0, lost) == 1  # only the one just before the loss was seen
    verdict = judge_loss(state, "trainer", {T(2): T0}, {"ray-1"}, T0, has_extension=False)
    assert verdict.shrink is not None
    events = apply_change(state, ResizeBegan(verdict.shrink, "node lost: node 1", forgiven=1), T0)
    assert state.roles["trainer"].inplace_restart_count == 1
    assert "1 in-place restart(s) it caused not counted" in events[0].message


def test_a_wait_for_nodes_is_said_once_with_what_it_waits_for(monkeypatch: pytest.MonkeyPatch) -> None:
    """NodeGroups.wait_start never waits silently: past WAIT_SAID_S it says, once per role, how
    many nodes it has, how long it waits, and what a node needs; then starts with MIN."""
    from dlu_prime.scheduler import node_groups
    from dlu_prime.scheduler.node_groups import NodeGroups

    spec = spec_from_dict(spec_of("1:2", 2, start_timeout_s=node_groups.WAIT_SAID_S + 0.5))
    groups = NodeGroups(spec, plan_placement(spec), group=lambda name: name)
    monkeypatch.setattr(groups, "placed", lambda role, nodes: [0])  # the second node never fits
    monkeypatch.setattr(groups, "needs", lambda role: "each node of the role needs {CPU: 2}")
    said: list[str] = []
    groups.on_wait = said.append
    starts, problem = groups.wait_start()
    assert (starts, problem) == ({"trainer": [0]}, None)
    assert said == [
        "role trainer: 1 of 2 node(s) placed; waiting up to 2.5s (elastic.start_timeout_s) for the "
        "rest, then starting with at least 1; each node of the role needs {CPU: 2}"
    ]


def test_nodes_placed_at_once_are_not_announced(monkeypatch: pytest.MonkeyPatch) -> None:
    from dlu_prime.scheduler.node_groups import NodeGroups

    spec = spec_from_dict(spec_of("1:2", 2))
    groups = NodeGroups(spec, plan_placement(spec), group=lambda name: name)
    monkeypatch.setattr(groups, "placed", lambda role, nodes: [0, 1])
    said: list[str] = []
    groups.on_wait = said.append
    assert groups.wait_start() == ({"trainer": [0, 1]}, None)
    assert said == []


def test_an_independent_crash_just_before_a_node_loss_stays_counted() -> None:
    """Defect 3: a process SIGKILLed ~100 ms before another rank's node is removed is a fault of
    its own; only the restarts the loss caused (a rank on the lost node, a lost peer's effect)
    are forgiven, never by being close in time."""
    state = running([0, 1])
    state.roles["trainer"].inplace_restart_count = 3
    crash = "round 2: job.trainer.0 exited -9: (no error text)"
    state.record("inplace_restart", crash, role="trainer", actor=T(0), node_id="ray-0", at=T0 - 0.1)
    on_lost = "round 3: job.trainer.2 exited 1: ValueError"
    state.record("inplace_restart", on_lost, role="trainer", actor=T(2), node_id="ray-1", at=T0 - 0.05)
    peer = "round 4: job.trainer.1 exited 1: RuntimeError: Connection closed by peer"
    state.record("inplace_restart", peer, role="trainer", actor=T(1), node_id="ray-0", at=T0)
    assert forgiven_by_loss(state, "trainer", T0, [T(2), T(3)]) == 2


def test_reports_during_a_node_loss_resize_are_judged_by_cause() -> None:
    """A resize of the role for a lost node is a recovery in flight: a peer's failed collective
    joins it uncounted, a rank on the lost node joins it, a crash of its own is counted once and
    recovered by the resize's new round (no restart of its own, no slow poll of the lost peer)."""
    from dlu_api.vocabulary import InPlaceVerdict
    from dlu_prime.master.failover import judge_inplace

    state = running([0, 1])
    verdict = judge_loss(state, "trainer", {T(2): T0}, {"ray-1"}, T0, has_extension=False)
    assert verdict.shrink is not None
    apply_change(state, ResizeBegan(verdict.shrink, "node lost: node 1, Ray marked it dead"), T0)
    peer = judge_inplace(state, "trainer", T(0), "exited 1", [], "Connection reset by peer")
    assert (
        peer.verdict is InPlaceVerdict.JOIN and not peer.counted and "resize of role trainer" in peer.reason
    )
    lost = judge_inplace(state, "trainer", T(3), "exited -9", [])
    assert lost.verdict is InPlaceVerdict.JOIN and not lost.counted
    own = judge_inplace(state, "trainer", T(0), "exited -9", [])
    assert own.verdict is InPlaceVerdict.JOIN and own.counted
