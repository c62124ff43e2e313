"""The bundles a memory relaunch left reserved and unused, and which actor may take them. Pure.

Ray gives a placement group's bundles back only with the whole group, and removing a group kills
the actors in it: an actor relaunched into a group of its own leaves its share of its role's
bundle reserved while others of the job still sit in that group. That share is reused instead of
reserving more: the next actor of the same role that fits it (a rank a growth adds, a later
relaunch whose new size fits what is left of its bundle) is seated there (`Ledger.choose`), and
the group is given back once no actor of the job is left in it (`Ledger.vacated`).

Where each actor sits (`Ledger.where`): its seat if it has one (a bundle of its role's group it
took), else its own group where a relaunch gave it other memory (None here), else its planned
bundle. A planned actor the job does not run now (a rank a shrink removed) keeps its bundle: it
comes back there. The node groups of an elastic role are never reused nor given back (each is
how the job holds that node); their unused share is only reported.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import Any

from dlu_api.spec.units import format_resources
from dlu_prime.scheduler.placement import ActorPlan, GroupPlan

Seat = tuple[str, int]
"""A bundle: (group name, bundle index)."""

_SLACK = 1e-6  # Ray's amounts are on a 1e-4 grid; sums of floats may miss it by less than this


def seat_text(seat: Seat) -> str:
    """How a seat is saved on the actor's record: `group#index` (no role or group name has '#')."""
    return f"{seat[0]}#{seat[1]}"


def parse_seat(text: str) -> Seat:
    group, _, index = text.rpartition("#")
    return group, int(index)


def needs(options: Mapping[str, Any], memory: int | None = None) -> dict[str, float]:
    """What one actor takes from its bundle (Ray's names, memory in bytes), zeros left out."""
    wanted: dict[str, float] = {
        "CPU": float(options.get("num_cpus", 0.0)),
        "GPU": float(options.get("num_gpus", 0.0)),
        "memory": float(memory if memory is not None else options.get("memory", 0)),
        **{name: float(amount) for name, amount in dict(options.get("resources", {})).items()},
    }
    return {name: amount for name, amount in wanted.items() if amount > 0}


def fits(need: Mapping[str, float], free: Mapping[str, float]) -> bool:
    return all(free.get(name, 0.0) + _SLACK >= amount for name, amount in need.items())


@dataclass(frozen=True)
class FreeBundle:
    group: str
    index: int
    unused: dict[str, float]
    empty: bool  # no actor of the job sits in it

    def text(self) -> str:
        """What `dlu status` and the timeline say of it."""
        state = "free" if self.empty else "partly free"
        return f"bundle {self.index} of group {self.group} {state}, {format_resources(self.unused)} reserved unused"


@dataclass(frozen=True)
class Ledger:
    """The job's placement groups and where its actors sit in them."""

    groups: Mapping[str, GroupPlan]  # the spec's groups by name (the ones a seat may be in)
    plans: Mapping[str, ActorPlan]  # every actor of the job, with its planned place
    memory: Mapping[str, int] = field(default_factory=dict[str, int])  # relaunch overrides
    seats: Mapping[str, Seat] = field(default_factory=dict[str, Seat])
    kept: Collection[str] = frozenset()  # groups never reused nor given back (node groups)

    def where(self, name: str) -> Seat | None:
        seat = self.seats.get(name)
        if seat is not None:
            return seat
        if name in self.memory:
            return None
        plan = self.plans[name]
        return plan.group, plan.bundle_index

    def _sitting(self, leaving: str | None) -> dict[Seat, list[str]]:
        out: dict[Seat, list[str]] = {}
        for name in self.plans:
            seat = self.where(name)
            if seat is not None and name != leaving:
                out.setdefault(seat, []).append(name)
        return out

    def _touched(self, leaving: str | None) -> set[Seat]:
        """Bundles a planned actor is not in (it moved, or is leaving now)."""
        return {
            (plan.group, plan.bundle_index)
            for name, plan in self.plans.items()
            if plan.group in self.groups
            and (name == leaving or self.where(name) != (plan.group, plan.bundle_index))
        }

    def free(self, leaving: str | None = None) -> list[FreeBundle]:
        """Every bundle an actor left with something reserved and unused, `leaving` counted out."""
        sitting = self._sitting(leaving)
        out: list[FreeBundle] = []
        for group, index in sorted(
            self._touched(leaving) | {s for s in self.seats.values() if s[0] in self.groups}
        ):
            unused = dict(self.groups[group].bundles[index].resources)
            for name in sitting.get((group, index), []):
                for resource, amount in needs(self.plans[name].options, self.memory.get(name)).items():
                    unused[resource] = unused.get(resource, 0.0) - amount
            unused = {r: a for r, a in unused.items() if a > _SLACK and not (r == "CPU" and a < 0.01)}
            if unused:
                out.append(FreeBundle(group, index, unused, not sitting.get((group, index))))
        return out

    def vacated(self, leaving: str | None = None) -> set[str]:
        """The groups no actor of the job is left in (every actor planned there sits elsewhere,
        none is seated there): they may be given back."""
        sitting = self._sitting(leaving)
        planned: dict[str, list[str]] = {}
        for name, plan in self.plans.items():
            planned.setdefault(plan.group, []).append(name)
        return {
            group
            for group in self.groups
            if group not in self.kept and planned.get(group) and not any(seat[0] == group for seat in sitting)
        }

    def choose(self, name: str, memory: int | None) -> Seat | None:
        """A bundle of its role's group that `name` fits in with `memory` (None: its role's),
        its own planned bundle first; None: none fits, or the only ones are in the group it
        leaves empty (that group is given back whole instead)."""
        plan = self.plans[name]
        need = needs(plan.options, memory)
        gone = self.vacated(leaving=name)
        home = (plan.group, plan.bundle_index)
        candidates = [
            bundle
            for bundle in self.free(leaving=name)
            if bundle.group not in self.kept
            and bundle.group not in gone
            and plan.role in self.groups[bundle.group].roles
            and fits(need, bundle.unused)
        ]
        candidates.sort(key=lambda b: ((b.group, b.index) != home, b.group, b.index))
        return (candidates[0].group, candidates[0].index) if candidates else None
