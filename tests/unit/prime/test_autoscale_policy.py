"""The auto-scaling policy on its own (pure): marginal throughput against linear scaling for an
elastic role, backlog sizing for a worker role, never outside min:max, never a size that failed."""

from __future__ import annotations

import pytest

from dlu_api.spec.autoscale_settings import AutoscaleSettings
from dlu_prime.autoscale.policy import RoleView, backlog_target, choose, elastic_size
from dlu_prime.stats import explore_scaling
from dlu_prime.testing.sim.workloads import step_time


def speeds(compute_s: float, comm_s: float, sizes: range) -> dict[int, float]:
    return {n: 1 / step_time(n, compute_s, comm_s) for n in sizes}


def trainer(current: int, by_size: dict[int, float], low: int = 1, high: int = 8, **kw: object) -> RoleView:
    return RoleView("trainer", True, current, low, high, by_size, "samples/s", **kw)  # type: ignore[arg-type]


def test_an_unmeasured_size_waits() -> None:
    assert not elastic_size(trainer(4, {}), 0.7).changes


def test_grows_while_the_added_nodes_pay_and_says_its_inputs() -> None:
    decision = elastic_size(trainer(4, {4: 310.0, 5: 380.0}), 0.7)
    assert (decision.current, decision.target) == (4, 5)
    assert (
        decision.reason == "trainer 4 -> 5: 4 nodes 310.0 samples/s, 5 nodes 380.0 samples/s, 90% of linear"
    )


def test_shrinks_back_from_a_size_that_did_not_pay() -> None:
    decision = elastic_size(trainer(5, {4: 310.0, 5: 320.0}), 0.7)
    assert decision.target == 4 and "(< 70%)" in decision.reason


def test_from_its_max_it_measures_the_size_below() -> None:
    decision = elastic_size(trainer(8, {8: 500.0}), 0.7)
    assert decision.target == 7 and "at its max 8; measuring 7 nodes" in decision.reason


def test_never_below_min_nor_above_max() -> None:
    at_min = elastic_size(trainer(2, {2: 100.0, 3: 101.0}, low=2, high=3), 0.7)
    assert not at_min.changes  # the step up did not pay, and 1 is below MIN
    at_max = elastic_size(trainer(3, {2: 100.0, 3: 150.0}, low=2, high=3), 0.7)
    assert not at_max.changes and "at its max 3" in at_max.reason


def test_a_size_whose_resize_failed_is_not_proposed_again() -> None:
    decision = elastic_size(trainer(4, {4: 310.0}, failed=frozenset({5})), 0.7)
    assert not decision.changes and "a resize to 5 failed before" in decision.reason


def _climb(start: int, threshold: float, by: dict[int, float]) -> tuple[int, int]:
    """Where the policy settles from `start`, measuring each size it visits; (size, moves)."""
    seen: dict[int, float] = {}
    size, moves = start, 0
    for _ in range(40):
        seen[size] = by[size]
        decision = explore_scaling("trainer", seen, size, 1, 8, threshold, unit="steps/s")
        if not decision.changes:
            return size, moves
        size, moves = decision.target, moves + 1
    raise AssertionError("did not settle")


def test_a_communication_bound_job_settles_where_the_threshold_says_from_both_ends() -> None:
    by = speeds(1.0, 0.04, range(1, 9))  # best throughput at 5 nodes
    best = max(by, key=by.__getitem__)
    assert 1 < best < 8
    for threshold, expected in ((0.7, 2), (0.4, 3), (0.3, 4), (0.2, 4)):
        assert _climb(1, threshold, by)[0] == expected
        assert _climb(8, threshold, by)[0] == expected
    assert by[4] >= 0.9 * by[best] > by[3]  # 0.3 lands within 10% of the best throughput, 0.4 does not


@pytest.mark.parametrize("comm_s", [0.02, 0.04, 0.08])
def test_the_default_threshold_lands_within_10_percent_of_the_best_and_refuses_a_node_that_brings_little(
    comm_s: float,
) -> None:
    """Issue 30 (a): the spec's default, from both ends, on three communication costs."""
    by = speeds(1.0, comm_s, range(1, 9))
    best = max(by, key=by.__getitem__)
    assert 1 < best < 8
    default = AutoscaleSettings().marginal_threshold
    for start in (1, 8):
        size, _ = _climb(start, default, by)
        assert by[size] >= 0.9 * by[best], (comm_s, start, size)
        grown = (by[size + 1] - by[size]) / (by[size] / size)  # what the next node brings, of linear
        assert grown < default, (comm_s, size, grown)


def test_backlog_sizing_counts_what_arrives_meanwhile() -> None:
    view = RoleView("prep", False, 2, 1, 16, backlog=300, drain_per_actor=5.0, arrival_per_s=20.0)
    decision = backlog_target(view, 30.0)
    assert decision.target == 6  # (300 / 30 + 20) / 5
    assert decision.reason.startswith("prep 2 -> 6: backlog 300, 20.0/s arriving, 5.0/s per actor")


def test_backlog_sizing_stays_within_its_bounds() -> None:
    view = RoleView("prep", False, 2, 1, 4, backlog=10_000, drain_per_actor=5.0, arrival_per_s=0.0)
    decision = backlog_target(view, 30.0)
    assert decision.target == 4 and "(bounded to 1:4)" in decision.reason
    empty = RoleView("prep", False, 3, 1, 4, backlog=0, drain_per_actor=None)
    assert backlog_target(empty, 30.0).target == 1


def test_choose_gives_each_role_its_algorithm() -> None:
    settings = AutoscaleSettings(mode="single-job", backlog_roles={"prep": "samples"})  # type: ignore[arg-type]
    views = [trainer(8, {8: 1.0}), RoleView("prep", False, 2, 1, 4, backlog=0)]
    assert [(d.role, d.target) for d in choose(views, settings)] == [("trainer", 7), ("prep", 1)]
