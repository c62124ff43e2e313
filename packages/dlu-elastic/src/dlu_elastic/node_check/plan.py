"""Pairing and verdicts of the node check (DESIGN section 3), free of torch and Ray.

A pair's timing mixes both nodes: a dead or slow network link fails or slows both ends, so
one round cannot tell which node is to blame. Round 2 therefore pairs every suspect with a
node that was fast in round 1; a node's score is its best round, and only a node that fails
both rounds is faulty. This module decides who meets whom and what the timings mean; the
master runs it for thousands of nodes, so it stays linear and allocation-light.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from dlu_api.spec.models import NodeCheckSettings

Group = tuple[str, ...]

_SUMMARY_NAMES = 10  # a summary lists at most this many nodes per verdict, then "+N more"


@dataclass(frozen=True, slots=True)
class NodeResult:
    """One node's outcome in one round: `elapsed_s` is None when its probe failed."""

    node: str
    elapsed_s: float | None
    error: str | None = None


def by_node(results: Iterable[NodeResult]) -> dict[str, NodeResult]:
    """Index a round's reports by node; a later report of the same node wins."""
    return {result.node: result for result in results}


def passed_time(result: NodeResult | None, timeout_s: float) -> float | None:
    """The reported time if the probe passed; a missing, failed or late (> timeout) probe is None."""
    if result is None or result.elapsed_s is None or result.elapsed_s > timeout_s:
        return None
    return result.elapsed_s


def pair_round1(nodes: Sequence[str]) -> list[Group]:
    """Neighbours in the given order ((a, b), (c, d), ...); an odd last node joins a triple.

    The order is the caller's (the master passes nodes in rank order), so the same membership
    always meets the same partners. The first node of a group hosts its rendezvous. A single
    node forms a group of one: it can still time its own compute.
    """
    if len(set(nodes)) != len(nodes):
        raise ValueError("node check: duplicate node names")
    count = len(nodes)
    if count < 2:
        return [tuple(nodes)] if count else []
    groups: list[Group] = [(nodes[i], nodes[i + 1]) for i in range(0, count - 1, 2)]
    if count % 2:
        groups[-1] = (*groups[-1], nodes[-1])
    return groups


def suspects(results_round1: Mapping[str, NodeResult], settings: NodeCheckSettings) -> list[str]:
    """Nodes that failed round 1 or were slower than `straggler_ratio` x the median passed time."""
    timeout_s = settings.timeout_s
    times: dict[str, float | None] = {
        node: passed_time(result, timeout_s) for node, result in results_round1.items()
    }
    good = [t for t in times.values() if t is not None]
    limit = statistics.median(good) * settings.straggler_ratio if good else 0.0
    return [node for node, t in times.items() if t is None or t > limit]


def pair_round2(results_round1: Mapping[str, NodeResult], settings: NodeCheckSettings) -> list[Group]:
    """Each suspect with a known-good partner: `(fast, suspect)`, fastest partners first.

    Suspects are taken in round-1 order. With more suspects than fast nodes the fast nodes are
    reused round-robin, so one node may appear in several groups: run those in separate waves
    (see `waves`). With no fast node at all there is no partner to trust, so each suspect runs
    alone, timing its own compute. No suspects, no round 2 (an empty list).
    """
    suspect_list = suspects(results_round1, settings)
    if not suspect_list:
        return []
    suspect_set = set(suspect_list)
    order = {node: index for index, node in enumerate(results_round1)}
    fast = sorted(
        (node for node in results_round1 if node not in suspect_set),
        key=lambda node: (results_round1[node].elapsed_s, order[node]),
    )
    if not fast:
        return [(node,) for node in suspect_list]
    return [(fast[index % len(fast)], node) for index, node in enumerate(suspect_list)]


def waves(groups: Sequence[Group]) -> list[list[Group]]:
    """Split groups into waves in which no node appears twice, keeping their order.

    A node runs one probe at a time (a process has one default process group), so groups that
    share a node, as round 2 makes when fast nodes are scarce, must run one after another.
    """
    result: list[list[Group]] = []
    busy: list[set[str]] = []
    next_wave: dict[str, int] = {}  # the first wave in which each node is still free
    for group in groups:
        index = max((next_wave.get(node, 0) for node in group), default=0)
        while index < len(result) and any(node in busy[index] for node in group):
            index += 1
        if index == len(result):
            result.append([])
            busy.append(set())
        result[index].append(group)
        busy[index].update(group)
        for node in group:
            next_wave[node] = index + 1
    return result


@dataclass(frozen=True, slots=True)
class NodeCheckVerdict:
    """What the check concluded: per-node scores (None: never passed) and the named nodes.

    `faulty` nodes count as node failures (DESIGN section 4); `stragglers` are reported, and
    `excluded` adds them to the faulty ones when the settings ask to exclude stragglers.
    `unverified` nodes failed round 1 but have no round-2 result because no round 2 was run:
    one failure is not proof, since their partner may be the one to blame.
    """

    scores: dict[str, float | None]
    faulty: tuple[str, ...]
    stragglers: tuple[str, ...]
    excluded: tuple[str, ...]
    median_s: float | None
    straggler_limit_s: float | None
    rounds: int
    errors: dict[str, str] = field(default_factory=dict)
    unverified: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        """True when no node has to be excluded from training."""
        return not self.excluded and not self.unverified

    def summary(self) -> str:
        """One line for the event timeline and `dlu status`."""
        median = "n/a" if self.median_s is None else f"{self.median_s:.3f}s"
        parts = [f"node check: {len(self.scores)} nodes, {self.rounds} round(s), median {median}"]
        if self.faulty:
            parts.append("faulty: " + _names(self.faulty, self.errors.get))
        if self.stragglers:
            parts.append("stragglers: " + _names(self.stragglers, self._straggler_note))
        if self.unverified:
            parts.append("unverified: " + _names(self.unverified, self.errors.get))
        if len(parts) == 1:
            parts.append("all healthy")
        return "; ".join(parts)

    def _straggler_note(self, node: str) -> str | None:
        score = self.scores.get(node)
        if score is None or not self.median_s:
            return None
        return f"{score:.3f}s, {score / self.median_s:.1f}x median"


def _names(nodes: Sequence[str], note: Callable[[str], str | None]) -> str:
    shown: list[str] = []
    for node in nodes[:_SUMMARY_NAMES]:
        text = note(node)
        shown.append(f"{node} ({text})" if text else node)
    more = len(nodes) - _SUMMARY_NAMES
    return ", ".join(shown) + (f", +{more} more" if more > 0 else "")


def judge(
    round1: Mapping[str, NodeResult],
    round2: Mapping[str, NodeResult] | None,
    settings: NodeCheckSettings,
) -> NodeCheckVerdict:
    """Score every node of round 1 by its best passed round and name the faulty and slow ones.

    `round2` is None when no second round was run. When one was run, a suspect with no
    round-2 report counts as having failed it (its probe never answered).
    """
    timeout_s = settings.timeout_s
    retested = round2 is not None
    second: Mapping[str, NodeResult] = round2 or {}
    scores: dict[str, float | None] = {}
    errors: dict[str, str] = {}
    faulty: list[str] = []
    unverified: list[str] = []
    for node, first in round1.items():
        times = [
            t
            for t in (passed_time(first, timeout_s), passed_time(second.get(node), timeout_s))
            if t is not None
        ]
        best = min(times) if times else None
        scores[node] = best
        if best is not None:
            continue
        errors[node] = _failure(first, second.get(node), timeout_s, retested)
        (faulty if retested else unverified).append(node)

    healthy = [score for score in scores.values() if score is not None]
    median_s = statistics.median(healthy) if healthy else None
    limit = None if median_s is None else median_s * settings.straggler_ratio
    stragglers = (
        ()
        if limit is None
        else tuple(node for node, score in scores.items() if score is not None and score > limit)
    )
    excluded = (*faulty, *stragglers) if settings.exclude_stragglers else tuple(faulty)
    return NodeCheckVerdict(
        scores=scores,
        faulty=tuple(faulty),
        stragglers=stragglers,
        excluded=excluded,
        median_s=median_s,
        straggler_limit_s=limit,
        rounds=2 if retested else 1,
        errors=errors,
        unverified=tuple(unverified),
    )


def _failure(first: NodeResult, second: NodeResult | None, timeout_s: float, retested: bool) -> str:
    """Why a node never passed, round by round, for the timeline."""
    reasons = [f"round 1: {_reason(first, timeout_s)}"]
    if retested:
        reasons.append(f"round 2: {_reason(second, timeout_s)}")
    return "; ".join(reasons)


def _reason(result: NodeResult | None, timeout_s: float) -> str:
    if result is None:
        return "no report"
    if result.elapsed_s is not None and result.elapsed_s > timeout_s:
        return f"timed out ({result.elapsed_s:.1f}s > {timeout_s:g}s)"
    return result.error or "failed"
