"""Node-check pairing and verdicts (DESIGN section 3), with simulated probes and no torch."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterable, Mapping, Sequence

import pytest

from dlu_api.spec.models import NodeCheckSettings
from dlu_elastic.node_check import (
    NodeCheckVerdict,
    NodeResult,
    by_node,
    injected_faults,
    judge,
    pair_round1,
    pair_round2,
    suspects,
    waves,
)

SETTINGS = NodeCheckSettings(timeout_s=10.0, straggler_ratio=2.0)


def names(count: int) -> list[str]:
    return [f"n{i:04d}" for i in range(count)]


def simulate(
    groups: Iterable[Sequence[str]],
    broken: frozenset[str] = frozenset(),
    slow_compute: Mapping[str, float] | None = None,
    slow_link: Mapping[str, float] | None = None,
    base: float = 1.0,
) -> dict[str, NodeResult]:
    """One round as the probe measures it: a broken node fails its whole group, a node's own
    compute delay shows only in its own time, a slow link slows every member of its group."""
    compute = slow_compute or {}
    link = slow_link or {}
    results: dict[str, NodeResult] = {}
    for group in groups:
        if broken & set(group):
            for node in group:
                results[node] = NodeResult(node, None, "connection closed by peer")
            continue
        shared = max((link.get(node, 0.0) for node in group), default=0.0)
        for node in group:
            results[node] = NodeResult(node, base + compute.get(node, 0.0) + shared)
    return results


def check_all(
    nodes: Sequence[str],
    settings: NodeCheckSettings = SETTINGS,
    broken: frozenset[str] = frozenset(),
    slow_compute: Mapping[str, float] | None = None,
    slow_link: Mapping[str, float] | None = None,
) -> tuple[list[tuple[str, ...]], NodeCheckVerdict]:
    """Both rounds end to end, as the master would run them."""

    def run(groups: list[tuple[str, ...]]) -> dict[str, NodeResult]:
        return simulate(groups, broken, slow_compute, slow_link)

    round1 = run(pair_round1(nodes))
    groups2 = pair_round2(round1, settings)
    return groups2, judge(round1, run(groups2) if groups2 else None, settings)


# -- round 1 ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("count", "expected"),
    [
        (0, []),
        (1, [("a",)]),
        (2, [("a", "b")]),
        (3, [("a", "b", "c")]),
        (4, [("a", "b"), ("c", "d")]),
        (5, [("a", "b"), ("c", "d", "e")]),
        (8, [("a", "b"), ("c", "d"), ("e", "f"), ("g", "h")]),
    ],
)
def test_round1_pairs_neighbours_and_makes_a_triple_when_odd(
    count: int, expected: list[tuple[str, ...]]
) -> None:
    assert pair_round1("abcdefgh"[:count]) == expected


def test_round1_is_deterministic_and_follows_the_given_order() -> None:
    nodes = names(9)
    assert pair_round1(nodes) == pair_round1(list(nodes))
    assert pair_round1(list(reversed(nodes)))[0] == ("n0008", "n0007")


def test_round1_refuses_duplicate_nodes() -> None:
    with pytest.raises(ValueError, match="duplicate"):
        pair_round1(["a", "b", "a"])


def test_round1_for_4000_nodes_covers_every_node_once() -> None:
    nodes = names(4001)
    groups = pair_round1(nodes)
    flat = [node for group in groups for node in group]
    assert sorted(flat) == sorted(nodes)
    assert [len(g) for g in groups] == [2] * 1999 + [3]


# -- round 2 ---------------------------------------------------------------------------------


def test_no_suspects_means_no_round2() -> None:
    round1 = simulate(pair_round1(names(8)))
    assert suspects(round1, SETTINGS) == []
    assert pair_round2(round1, SETTINGS) == []


def test_round2_pairs_each_suspect_with_a_distinct_fast_node_fastest_first() -> None:
    nodes = ["a", "b", "c", "d", "e", "f"]
    round1 = simulate(pair_round1(nodes), broken=frozenset({"c"}), slow_compute={"a": 0.2, "f": 0.1})
    assert suspects(round1, SETTINGS) == ["c", "d"]
    # the fast partner comes first: it hosts the group's rendezvous
    assert pair_round2(round1, SETTINGS) == [("b", "c"), ("e", "d")]


def test_slow_and_timed_out_nodes_are_suspects() -> None:
    round1 = {
        "a": NodeResult("a", 1.0),
        "b": NodeResult("b", 1.1),
        "c": NodeResult("c", 2.5),  # > 2 x median
        "d": NodeResult("d", 11.0),  # > timeout_s: a failure, and not part of the median
        "e": NodeResult("e", 1.2),
    }
    assert suspects(round1, SETTINGS) == ["c", "d"]
    assert pair_round2(round1, SETTINGS) == [("a", "c"), ("b", "d")]


def test_round2_reuses_fast_nodes_round_robin_and_waves_keep_nodes_single() -> None:
    round1 = simulate(pair_round1(names(6)), broken=frozenset({"n0000", "n0002"}))
    groups = pair_round2(round1, SETTINGS)
    assert groups == [("n0004", "n0000"), ("n0005", "n0001"), ("n0004", "n0002"), ("n0005", "n0003")]
    planned = waves(groups)
    assert planned == [[("n0004", "n0000"), ("n0005", "n0001")], [("n0004", "n0002"), ("n0005", "n0003")]]
    for wave in planned:
        members = [node for group in wave for node in group]
        assert len(members) == len(set(members))


def test_round2_without_any_fast_node_runs_suspects_alone() -> None:
    round1 = simulate(pair_round1(["a", "b"]), broken=frozenset({"b"}))
    assert pair_round2(round1, SETTINGS) == [("a",), ("b",)]
    _, verdict = check_all(["a", "b"], broken=frozenset({"b"}))
    assert verdict.faulty == ("b",)
    assert verdict.scores["a"] == 1.0


def test_round2_is_deterministic() -> None:
    round1 = simulate(
        pair_round1(names(40)), broken=frozenset({"n0003", "n0017"}), slow_compute={"n0020": 5.0}
    )
    assert pair_round2(round1, SETTINGS) == pair_round2(dict(round1), SETTINGS)


# -- verdicts --------------------------------------------------------------------------------


def test_faulty_only_when_failing_both_rounds() -> None:
    groups2, verdict = check_all(names(8), broken=frozenset({"n0002"}))
    assert groups2 == [("n0000", "n0002"), ("n0001", "n0003")]
    # n0003 failed round 1 with its broken partner but passed round 2; n0000 failed round 2
    # next to the broken node but passed round 1: neither is faulty.
    assert verdict.faulty == ("n0002",)
    assert verdict.scores["n0002"] is None
    assert verdict.scores["n0003"] == 1.0
    assert verdict.scores["n0000"] == 1.0
    assert verdict.excluded == ("n0002",)
    assert not verdict.ok
    assert verdict.errors["n0002"] == "round 1: connection closed by peer; round 2: connection closed by peer"


def test_a_suspect_with_no_round2_report_counts_as_failed() -> None:
    round1 = simulate(pair_round1(["a", "b", "c", "d"]), broken=frozenset({"a"}))
    round2 = by_node([NodeResult("c", 1.0), NodeResult("a", None, "boom"), NodeResult("d", 1.0)])
    verdict = judge(round1, round2, SETTINGS)
    assert verdict.faulty == ("a", "b")
    assert "round 2: no report" in verdict.errors["b"]


def test_without_round2_a_round1_failure_is_unverified_not_faulty() -> None:
    round1 = simulate(pair_round1(["a", "b", "c", "d"]), broken=frozenset({"a"}))
    verdict = judge(round1, None, SETTINGS)
    assert verdict.faulty == ()
    assert verdict.unverified == ("a", "b")
    assert verdict.rounds == 1
    assert not verdict.ok
    assert "unverified: a (round 1: connection closed by peer)" in verdict.summary()


def test_score_is_the_best_round() -> None:
    # a slow link slows the whole round-1 pair; round 2 clears the innocent end
    groups2, verdict = check_all(names(8), slow_link={"n0006": 4.0})
    assert groups2 == [("n0000", "n0006"), ("n0001", "n0007")]
    assert verdict.scores["n0007"] == 1.0
    assert verdict.scores["n0006"] == 5.0
    assert verdict.scores["n0000"] == 1.0  # its slow round 2 does not count against it
    assert verdict.stragglers == ("n0006",)
    assert verdict.faulty == ()


def test_straggler_threshold_comes_from_settings() -> None:
    nodes = names(10)
    _, strict = check_all(nodes, NodeCheckSettings(straggler_ratio=1.5), slow_compute={"n0004": 1.0})
    _, lenient = check_all(nodes, NodeCheckSettings(straggler_ratio=3.0), slow_compute={"n0004": 1.0})
    assert strict.stragglers == ("n0004",)
    assert strict.median_s == 1.0
    assert strict.straggler_limit_s == 1.5
    assert lenient.stragglers == ()
    assert lenient.ok


def test_stragglers_are_excluded_only_when_asked() -> None:
    broken, slow = frozenset({"n0001"}), {"n0004": 9.0}
    _, kept = check_all(names(6), NodeCheckSettings(exclude_stragglers=False), broken, slow)
    _, dropped = check_all(names(6), NodeCheckSettings(exclude_stragglers=True), broken, slow)
    assert kept.excluded == ("n0001",)
    assert dropped.excluded == ("n0001", "n0004")
    assert kept.stragglers == dropped.stragglers == ("n0004",)


def test_a_time_over_the_timeout_is_a_failure() -> None:
    settings = NodeCheckSettings(timeout_s=5.0)
    round1 = by_node([NodeResult("a", 1.0), NodeResult("b", 7.0), NodeResult("c", 1.0), NodeResult("d", 1.0)])
    assert pair_round2(round1, settings) == [("a", "b")]
    round2 = by_node([NodeResult("a", 6.0), NodeResult("b", 6.0)])
    verdict = judge(round1, round2, settings)
    assert verdict.faulty == ("b",)
    assert verdict.scores["a"] == 1.0
    assert verdict.errors["b"] == "round 1: timed out (7.0s > 5s); round 2: timed out (6.0s > 5s)"


def test_summary_names_faulty_nodes_and_stragglers() -> None:
    _, verdict = check_all(names(8), broken=frozenset({"n0002"}), slow_compute={"n0005": 3.0})
    text = verdict.summary()
    assert text.startswith("node check: 8 nodes, 2 round(s), median 1.000s")
    assert "faulty: n0002 (round 1: connection closed by peer; round 2: connection closed by peer)" in text
    assert "stragglers: n0005 (4.000s, 4.0x median)" in text
    _, healthy = check_all(names(4))
    assert healthy.summary() == "node check: 4 nodes, 1 round(s), median 1.000s; all healthy"


def test_summary_stays_short_for_many_bad_nodes() -> None:
    broken = frozenset(names(4000)[::100])
    _, verdict = check_all(names(4000), broken=broken)
    assert verdict.faulty == tuple(sorted(broken))
    assert "+30 more" in verdict.summary()
    assert len(verdict.summary()) < 2000


def test_4000_nodes_end_to_end_is_correct() -> None:
    """Correctness at scale; its cost is benchmarks/node_check_plan.py's figure."""
    nodes = names(4000)
    broken = frozenset(nodes[7::397])
    slow = {node: 5.0 for node in nodes[100::800]}
    round1 = simulate(pair_round1(nodes), broken=broken, slow_compute=slow)
    groups2 = pair_round2(round1, SETTINGS)
    round2 = simulate(groups2, broken=broken, slow_compute=slow)
    verdict = judge(round1, round2, SETTINGS)
    assert verdict.faulty == tuple(sorted(broken))
    assert verdict.stragglers == tuple(sorted(slow))
    suspect_nodes = {node for group in groups2 for node in group[1:]}
    assert len(suspect_nodes) == 2 * len(broken) + len(slow)
    assert len({group[0] for group in groups2}) == len(groups2)  # distinct fast partners


# -- fault injection knobs (pure) ------------------------------------------------------------


def test_injected_faults_from_env() -> None:
    assert injected_faults({}) == (0.0, False)
    assert injected_faults({"DLU_NODE_CHECK_DELAY_S": "1.5", "DLU_NODE_CHECK_FAIL": "True"}) == (1.5, True)
    assert injected_faults({"DLU_NODE_CHECK_DELAY_S": " ", "DLU_NODE_CHECK_FAIL": "0"}) == (0.0, False)
    for bad in (
        {"DLU_NODE_CHECK_DELAY_S": "slow"},
        {"DLU_NODE_CHECK_DELAY_S": "-1"},
        {"DLU_NODE_CHECK_FAIL": "maybe"},
    ):
        with pytest.raises(ValueError, match="DLU_NODE_CHECK"):
            injected_faults(bad)


def test_node_check_package_does_not_import_torch() -> None:
    code = "import sys, dlu_elastic.node_check; sys.exit('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0
