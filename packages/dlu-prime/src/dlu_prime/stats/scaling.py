"""Pure sizing algorithms, shared by the Brain's optimize processor and the job's own policy
(`dlu_prime.autoscale.policy`).

Each is a function of measurements and bounds, with the reason it gives in words, so every
decision can be an event that says why ("trainer 4 -> 6: 4 nodes 310 samples/s, 6 nodes 452
samples/s, 97% of linear").
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class SizeDecision:
    role: str
    current: int
    target: int
    reason: str

    @property
    def changes(self) -> bool:
        return self.target != self.current


def linear_fraction(by_size: dict[int, float], small: int, large: int) -> float:
    """How much of linear scaling the step small -> large kept: 1.0 when throughput grew in
    proportion to the size, 0 when it did not grow, below 0 when it fell."""
    base, grown = by_size[small], by_size[large]
    if base <= 0 or large <= small:
        return 0.0
    return (grown - base) / (base * (large - small) / small)


def _unit(elastic: bool) -> str:
    return "nodes" if elastic else "actors"


def best_size(by_size: dict[int, float], threshold: float, low: int, high: int) -> int | None:
    """The size a job should run at, from throughput measured at several sizes: climb from the
    smallest measured size while each step up keeps at least `threshold` of linear scaling.
    None when nothing inside low..high was measured."""
    sizes = sorted(s for s in by_size if low <= s <= high and by_size[s] > 0)
    if not sizes:
        return None
    best = sizes[0]
    for larger in sizes[1:]:
        if linear_fraction(by_size, best, larger) < threshold:
            break
        best = larger
    return best


def marginal_scaling(
    role: str,
    by_size: dict[int, float],
    current: int,
    low: int,
    high: int,
    threshold: float,
    step: int = 1,
    elastic: bool = True,
) -> SizeDecision:
    """Grow while the added capacity pays (at least `threshold` of linear), shrink back from a
    size that did not, explore the next size up while it is unmeasured. Never leaves low..high."""
    unit = _unit(elastic)

    def said(a: int, b: int) -> str:
        pct = 100 * linear_fraction(by_size, min(a, b), max(a, b))
        lo, hi = min(a, b), max(a, b)
        return f"{lo} {unit} {by_size[lo]:.1f} samples/s, {hi} {unit} {by_size[hi]:.1f} samples/s, {pct:.0f}% of linear"

    if current not in by_size:
        return SizeDecision(
            role, current, current, f"{role} stays at {current}: not measured at {current} {unit} yet"
        )
    smaller = [s for s in by_size if low <= s < current]
    if smaller:
        below = max(smaller)
        if linear_fraction(by_size, below, current) < threshold:
            return SizeDecision(
                role,
                current,
                below,
                f"{role} {current} -> {below}: {said(below, current)} (< {threshold:.0%})",
            )
    up = min(high, current + step)
    if up == current:
        return SizeDecision(role, current, current, f"{role} stays at {current}: at its max {high}")
    if up not in by_size:
        return SizeDecision(role, current, up, f"{role} {current} -> {up}: {up} {unit} not measured yet")
    fraction = linear_fraction(by_size, current, up)
    if fraction >= threshold:
        return SizeDecision(role, current, up, f"{role} {current} -> {up}: {said(current, up)}")
    return SizeDecision(
        role, current, current, f"{role} stays at {current}: {said(current, up)} (< {threshold:.0%})"
    )


def explore_scaling(
    role: str,
    by_size: dict[int, float],
    current: int,
    low: int,
    high: int,
    threshold: float,
    elastic: bool = True,
    unit: str = "samples/s",
    skip: frozenset[int] = frozenset(),
) -> SizeDecision:
    """`marginal_scaling`, and where it would stay at a size whose step up did not pay (or at
    its max), the size below it measured once: a job that starts large (a communication-bound
    job started at its max) finds its best size from above too. `skip`: sizes not to propose
    (a resize to them failed)."""
    decision = marginal_scaling(role, by_size, current, low, high, threshold, elastic=elastic)
    if unit != "samples/s":
        decision = SizeDecision(role, current, decision.target, decision.reason.replace("samples/s", unit))
    if decision.changes or current not in by_size:
        return decision
    down, up = current - 1, current + 1
    if down < low or down in by_size or down in skip:
        return decision
    if up in by_size and linear_fraction(by_size, current, up) >= threshold:
        return decision  # the step up paid: this size is below a good one, not above it
    units = _unit(elastic)
    why = f"at its max {high}" if current >= high else f"{up} {units} did not pay"
    return SizeDecision(
        role,
        current,
        down,
        f"{role} {current} -> {down}: {current} {units} {by_size[current]:.1f} {unit}, {why}; "
        f"measuring {down} {units}",
    )


def backlog_size(
    role: str,
    backlog: int,
    items_per_s_per_actor: float,
    target_delay_s: float,
    current: int,
    low: int,
    high: int,
) -> SizeDecision:
    """Actors enough to drain `backlog` within `target_delay_s` at the measured rate per actor."""
    if items_per_s_per_actor <= 0:
        return SizeDecision(
            role, current, current, f"{role} stays at {current}: no consumption rate measured"
        )
    need = math.ceil(backlog / (items_per_s_per_actor * target_delay_s)) if backlog > 0 else low
    target = max(low, min(high, need))
    why = (
        f"backlog {backlog} at {items_per_s_per_actor:.1f}/s per actor needs {need} for {target_delay_s:g} s"
        + (f" (bounded to {low}:{high})" if target != need else "")
    )
    if target == current:
        return SizeDecision(role, current, current, f"{role} stays at {current}: {why}")
    return SizeDecision(role, current, target, f"{role} {current} -> {target}: {why}")


def memory_relaunch(
    used_bytes: int, limit_bytes: int, pressure: float = 0.9, growth: float = 1.5
) -> int | None:
    """The memory to relaunch an actor with when it uses `pressure` of its limit or more, else None."""
    if limit_bytes <= 0 or used_bytes < pressure * limit_bytes:
        return None
    return int(max(limit_bytes * growth, used_bytes / pressure * 1.1))
