"""The pure sizing algorithms (dlu_prime.stats.scaling) the Brain's executor and the job's core use."""

from __future__ import annotations

import pytest

from dlu_prime.stats import backlog_size, best_size, linear_fraction, marginal_scaling, memory_relaunch

pytestmark = pytest.mark.timeout(30)

# compute / N plus a communication cost growing with N: best strictly inside 1..8
COMM = {n: 1.0 / (1.0 / n + 0.02 * n) for n in range(1, 9)}  # compute / N + comm x N: best at 7


def test_linear_fraction() -> None:
    assert linear_fraction({2: 100.0, 4: 200.0}, 2, 4) == pytest.approx(1.0)
    assert linear_fraction({2: 100.0, 4: 100.0}, 2, 4) == pytest.approx(0.0)
    assert linear_fraction({4: 310.0, 6: 452.0}, 4, 6) == pytest.approx(0.916, abs=1e-3)


def test_best_size_climbs_while_scaling_pays() -> None:
    assert best_size({1: 10.0, 2: 20.0, 4: 39.0, 8: 42.0}, 0.7, 1, 8) == 4
    assert best_size({1: 10.0, 2: 20.0}, 0.7, 1, 8) == 2
    assert best_size({}, 0.7, 1, 8) is None
    assert best_size({16: 5.0}, 0.7, 1, 8) is None  # outside the bounds
    assert best_size(COMM, 0.0, 1, 8) == max(COMM, key=COMM.__getitem__)


def test_marginal_scaling_explores_grows_and_shrinks() -> None:
    grow = marginal_scaling("trainer", {4: 310.0}, 4, 1, 8, 0.7)
    assert (grow.target, grow.reason) == (5, "trainer 4 -> 5: 5 nodes not measured yet")
    worth = marginal_scaling("trainer", {4: 310.0, 6: 452.0}, 4, 1, 8, 0.7, step=2)
    assert worth.target == 6
    assert worth.reason == "trainer 4 -> 6: 4 nodes 310.0 samples/s, 6 nodes 452.0 samples/s, 92% of linear"
    back = marginal_scaling("trainer", {4: 310.0, 6: 330.0}, 6, 1, 8, 0.7, step=2)
    assert back.target == 4 and "13% of linear (< 70%)" in back.reason
    top = marginal_scaling("trainer", {8: 1.0}, 8, 1, 8, 0.7)
    assert not top.changes and "at its max 8" in top.reason
    unknown = marginal_scaling("trainer", {}, 3, 1, 8, 0.7)
    assert not unknown.changes


def test_marginal_scaling_reaches_the_best_size_of_a_communication_bound_job() -> None:
    size, seen = 1, {1: COMM[1]}
    for _ in range(20):
        decision = marginal_scaling("trainer", seen, size, 1, 8, 0.0)
        size = decision.target
        seen[size] = COMM[size]
    best = max(COMM.values())
    assert COMM[size] >= 0.9 * best


def test_backlog_size() -> None:
    d = backlog_size("reader", 1200, 10.0, 30.0, 2, 1, 8)
    assert (d.target, d.reason) == (4, "reader 2 -> 4: backlog 1200 at 10.0/s per actor needs 4 for 30 s")
    assert backlog_size("reader", 100_000, 10.0, 30.0, 2, 1, 8).target == 8
    assert backlog_size("reader", 0, 10.0, 30.0, 4, 1, 8).target == 1
    assert not backlog_size("reader", 50, 0.0, 30.0, 4, 1, 8).changes


def test_memory_relaunch() -> None:
    assert memory_relaunch(5, 10) is None
    assert memory_relaunch(95, 100) == 150
    assert memory_relaunch(100, 0) is None
