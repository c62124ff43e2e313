"""What size each auto-scaled role should have, from the statistics the PrimeMaster holds. Pure.

Elastic roles climb by measured marginal throughput (`stats.scaling.explore_scaling`, as the
Brain does: grow while the added nodes keep `marginal_threshold` of linear scaling, shrink back
from a size that did not; a role that started at its max, or whose next size up did not pay,
also measures the size below it once, so a communication-bound job finds its best size from
above as well).
Backlog roles get actors enough to drain their backlog in `backlog_target_s` while items keep
arriving (`stats.scaling.backlog_size`, the arrivals counted into the backlog). Sizes never leave a role's min..max, and a size whose resize
failed (could not be placed) is not proposed again.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field

from dlu_api.spec.autoscale_settings import AutoscaleSettings
from dlu_prime.stats.scaling import SizeDecision, backlog_size, explore_scaling


@dataclass(frozen=True)
class RoleView:
    """One auto-scaled role as the statistics see it. `by_size`: its speed at each size it was
    measured at (nodes of an elastic role), in `unit`; backlog roles: the items waiting in the
    queue they drain and the items one actor drains per second while it has work."""

    role: str
    elastic: bool
    current: int
    low: int
    high: int
    by_size: Mapping[int, float] = field(default_factory=dict[int, float])
    unit: str = "steps/s"
    backlog: int | None = None
    drain_per_actor: float | None = None
    arrival_per_s: float | None = None
    failed: frozenset[int] = frozenset()  # sizes whose resize failed: not proposed again
    # seconds its current size has been measured since the last change (a world whose first
    # steps come late, its processes still starting, has been measured for less than it has run)
    measured_s: float = math.inf


def elastic_size(view: RoleView, threshold: float) -> SizeDecision:
    """The next node count of an elastic role (`stats.scaling.explore_scaling`)."""
    decision = explore_scaling(
        view.role,
        dict(view.by_size),
        view.current,
        view.low,
        view.high,
        threshold,
        True,
        view.unit,
        view.failed,
    )
    return _unless_failed(view, decision)


def backlog_target(view: RoleView, target_s: float) -> SizeDecision:
    """Actors enough to drain the role's backlog within `target_s` while items keep arriving:
    (backlog / target_s + arrival rate) / the rate one actor drains."""
    role, current = view.role, view.current
    backlog = view.backlog or 0
    arrival = view.arrival_per_s or 0.0
    rate = view.drain_per_actor or 0.0
    if rate <= 0:
        if backlog == 0 and current != view.low:
            return SizeDecision(role, current, view.low, f"{role} {current} -> {view.low}: backlog 0")
        return SizeDecision(role, current, current, f"{role} stays at {current}: no drain rate measured yet")
    # backlog_size sizes a backlog; the items arriving meanwhile count as part of it
    sized = backlog_size(
        role, math.ceil(backlog + arrival * target_s), rate, target_s, current, view.low, view.high
    )
    need = math.ceil((backlog + arrival * target_s) / (rate * target_s)) if backlog or arrival else view.low
    why = (
        f"backlog {backlog}, {arrival:.1f}/s arriving, {rate:.1f}/s per actor: needs {need} to drain it "
        f"in {target_s:g} s" + (f" (bounded to {view.low}:{view.high})" if sized.target != need else "")
    )
    if sized.target == current:
        return SizeDecision(role, current, current, f"{role} stays at {current}: {why}")
    return _unless_failed(
        view, SizeDecision(role, current, sized.target, f"{role} {current} -> {sized.target}: {why}")
    )


def choose(views: Collection[RoleView], settings: AutoscaleSettings) -> list[SizeDecision]:
    """One decision per role, in the order given (the caller carries out the first change)."""
    out: list[SizeDecision] = []
    for view in views:
        if view.role in settings.backlog_roles:
            out.append(backlog_target(view, settings.backlog_target_s))
        elif view.elastic:
            out.append(elastic_size(view, settings.marginal_threshold))
    return out


def _unless_failed(view: RoleView, decision: SizeDecision) -> SizeDecision:
    if decision.changes and decision.target in view.failed:
        return SizeDecision(
            view.role,
            view.current,
            view.current,
            f"{view.role} stays at {view.current}: a resize to {decision.target} failed before "
            f"({decision.reason})",
        )
    return decision
