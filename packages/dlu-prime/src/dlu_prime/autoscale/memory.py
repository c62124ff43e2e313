"""Which actor near its memory limit is relaunched with more memory, and with how much. Pure.

An actor whose measured memory stays at `PRESSURE` (90%) of its limit or more for `sustain_s`
(over two samples at least: one high sample is a spike, not a need) gets its limit x `GROWTH`
(1.5, as the Brain's `memory_relaunch` plan), never more than its node holds, and at most once
per `settle_s` (its new incarnation has to show what it uses first). An actor with no limit
(its role asks Ray for no memory) is left alone: nothing would change for it. A Brain's memory
plan names a role and a size: it goes to that role's actor under the most pressure now.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass

from dlu_api.spec.units import format_bytes
from dlu_prime.brain_port.models import RolePlan
from dlu_prime.stats.scaling import memory_relaunch

PRESSURE = 0.9  # of the limit: what the Brain calls memory pressure too
GROWTH = 1.5
MIN_SAMPLES = 2  # samples at pressure before it counts as sustained


@dataclass(frozen=True)
class MemoryView:
    """One actor at `PRESSURE` of its limit now: `since` the first of its `samples` consecutive
    samples there (reset by a sample below, or by a new limit)."""

    actor: str
    role: str
    label: str  # the actor as people read it: "trainer.3"
    used: int
    limit: int  # bytes its incarnation asks Ray for
    since: float
    samples: int
    node_memory: int | None = None  # what its node holds (None: not measured)
    raised_at: float | None = None  # when its last memory relaunch began

    @property
    def ratio(self) -> float:
        return self.used / self.limit if self.limit > 0 else 0.0


@dataclass(frozen=True)
class MemoryDecision:
    """Relaunch `actor` with `new` bytes instead of `old`; `reason` says it with its inputs."""

    actor: str
    role: str
    old: int
    new: int
    reason: str


def _settled(view: MemoryView, now: float, settle_s: float) -> bool:
    """Not relaunched within `settle_s`, and measured at pressure since its last relaunch."""
    return view.raised_at is None or (now - view.raised_at >= settle_s and view.since > view.raised_at)


def _bounded(view: MemoryView, wanted: int) -> int:
    return min(wanted, view.node_memory) if view.node_memory else wanted


def _decision(view: MemoryView, new: int, why: str = "") -> MemoryDecision | None:
    if new <= view.limit:
        return None  # its node holds no more than it has
    node = view.node_memory
    held = f" (its node holds {format_bytes(node)})" if node is not None and node == new else ""
    reason = (
        f"{view.label} at {format_bytes(view.used)} of {format_bytes(view.limit)} "
        f"({round(view.ratio * 100)}%): relaunched with {format_bytes(new)}{held}{why}"
    )
    return MemoryDecision(view.actor, view.role, view.limit, new, reason)


def relaunch(view: MemoryView, now: float, sustain_s: float, settle_s: float) -> MemoryDecision | None:
    """The relaunch `view` calls for now, or None (not sustained, relaunched lately, no room)."""
    if view.limit <= 0 or view.ratio < PRESSURE:
        return None
    if view.samples < MIN_SAMPLES or now - view.since < sustain_s or not _settled(view, now, settle_s):
        return None
    wanted = memory_relaunch(view.used, view.limit, PRESSURE, GROWTH)
    return _decision(view, _bounded(view, wanted or 0))


def choose(
    views: Collection[MemoryView], now: float, sustain_s: float, settle_s: float
) -> MemoryDecision | None:
    """The one relaunch of this pass: the actor under the most pressure that calls for one."""
    for view in sorted(views, key=lambda v: (-v.ratio, v.actor)):
        decision = relaunch(view, now, sustain_s, settle_s)
        if decision is not None:
            return decision
    return None


def for_plan(
    plan: RolePlan, views: Collection[MemoryView], now: float, settle_s: float
) -> MemoryDecision | str:
    """A Brain's memory plan for a role: its actor under the most pressure now gets the plan's
    memory (bounded by its node); else why it cannot be carried out."""
    wanted = plan.memory_bytes or 0
    found = [
        v
        for v in views
        if v.role == plan.role and v.limit > 0 and v.ratio >= PRESSURE and _settled(v, now, settle_s)
    ]
    if not found:
        return f"no actor of role {plan.role} is at {int(PRESSURE * 100)}% of its memory limit now"
    view = max(found, key=lambda v: (v.ratio, v.actor))
    decision = _decision(view, _bounded(view, wanted), f" (Brain plan #{plan.id}: {plan.reason})")
    if decision is None:
        room = f"its node holds {format_bytes(view.node_memory)}" if view.node_memory else "it has as much"
        return f"{view.label} asks for {format_bytes(view.limit)} already and {room}"
    return decision
