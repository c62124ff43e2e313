"""Cost of the node check's planning on the master: round-1 pairing, round-2 pairing, waves, verdict.

Probe results are simulated (1% of nodes broken, 1% slow) and not timed; only the pure
functions of `dlu_elastic.node_check.plan` are. The target is well under 50 ms for 4,000 nodes.
Prints the median of several runs per size, then FIGURE lines. Usage: `uv run python benchmarks/node_check_plan.py`.
"""

from __future__ import annotations

import statistics
import sys
import time
from collections.abc import Iterable, Sequence

from figures import figure

from dlu_api.spec.models import NodeCheckSettings
from dlu_elastic.node_check import NodeResult, judge, pair_round1, pair_round2, waves

SETTINGS = NodeCheckSettings()


def simulate(groups: Iterable[Sequence[str]], broken: set[str], slow: set[str]) -> dict[str, NodeResult]:
    results: dict[str, NodeResult] = {}
    for group in groups:
        failed = any(node in broken for node in group)
        for node in group:
            elapsed = None if failed else (5.0 if node in slow else 1.0)
            results[node] = NodeResult(node, elapsed, "peer closed" if failed else None)
    return results


def one_run(count: int) -> float:
    nodes = [f"node-{i:05d}" for i in range(count)]
    broken = set(nodes[3::100])
    slow = set(nodes[50::100])
    start = time.perf_counter()
    groups1 = pair_round1(nodes)
    spent = time.perf_counter() - start
    round1 = simulate(groups1, broken, slow)
    start = time.perf_counter()
    groups2 = pair_round2(round1, SETTINGS)
    waves(groups2)
    spent += time.perf_counter() - start
    round2 = simulate(groups2, broken, slow)
    start = time.perf_counter()
    verdict = judge(round1, round2, SETTINGS)
    verdict.summary()
    spent += time.perf_counter() - start
    assert set(verdict.faulty) == broken and set(verdict.stragglers) == slow
    return spent


TARGET_MS = 50.0  # this benchmark's own target for 4,000 nodes (not a DESIGN section 9 budget)


def main(runs: int = 7) -> None:
    medians: dict[int, float] = {}
    for count in (100, 1_000, 4_000):
        times = [one_run(count) for _ in range(runs)]
        medians[count] = statistics.median(times) * 1000
        print(f"node check plan, {count:>5} nodes: {medians[count]:7.2f} ms (median of {runs})")
    for count, ms in medians.items():
        figure(
            f"node_check_plan_{count}_nodes",
            ms,
            "ms",
            TARGET_MS if count == 4_000 else None,
            label=f"node check planning, {count:,} nodes"
            + (" (own target, not section 9)" if count == 4_000 else ""),
        )


if __name__ == "__main__":
    main(*(int(arg) for arg in sys.argv[1:2]))
