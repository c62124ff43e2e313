"""The job's reserved-but-unused bundles as the job state knows them (`scheduler.free_bundles`
over the state): which bundle a relaunched or added actor is seated in, what the timeline and
`dlu status` say of the bundles left free. Pure: the seats are saved on the actors' records
(`ActorRecord.seat`), so a rebuilt or resumed PrimeMaster knows them and tells its scheduler.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from dlu_api.vocabulary import EventKind
from dlu_prime.master.state import SUB_MASTER_RANK, JobState
from dlu_prime.scheduler.free_bundles import FreeBundle, Ledger, Seat, parse_seat, seat_text
from dlu_prime.scheduler.placement import (
    ActorPlan,
    is_node_grouped,
    node_group_name,
    plan_placement,
    scaled_actor,
)


@dataclass(frozen=True)
class ActorsSeated:
    """Actors a growth adds seated in bundles others left (`growth_seats`), saved before they
    are created, so a rebuilt PrimeMaster creates them there too."""

    seats: Mapping[str, str]


def actors_seated(state: JobState, change: ActorsSeated) -> list[tuple[EventKind, str]]:
    lines: list[tuple[EventKind, str]] = []
    for name, seat in change.seats.items():
        record = state.actors.get(name)
        if record is None:
            continue
        record.seat = seat
        group, _, index = seat.rpartition("#")
        lines.append(
            (
                EventKind.BUNDLE_REUSED,
                f"{name} placed in bundle {index} of group {group}, left free by a relaunch: nothing more reserved",
            )
        )
    return lines


def ledger(state: JobState, *, seats: dict[str, Seat] | None = None) -> Ledger:
    """Where the job's actors sit, from the spec's plan and the actors' records (`seats`: these
    instead of the saved ones)."""
    spec = state.spec
    plan = plan_placement(spec)
    plans: dict[str, ActorPlan] = {a.name: a for a in plan.actors}
    for name, record in state.actors.items():
        if record.rank != SUB_MASTER_RANK and name not in plans:  # a rank a growth added
            plans[name] = scaled_actor(spec, record.role, record.rank, record.rank + 1)[1]
    memory = {
        name: a.memory
        for name, a in state.actors.items()
        if a.memory is not None and a.memory != spec.role(a.role).resources.memory
    }
    saved = {name: parse_seat(a.seat) for name, a in state.actors.items() if a.seat is not None}
    kept = {
        node_group_name(r.name, k)
        for r in spec.roles
        if is_node_grouped(spec, r)
        for k in range(r.total // r.per_group)
    }
    return Ledger({g.name: g for g in plan.groups}, plans, memory, saved if seats is None else seats, kept)


def relaunch_seat(state: JobState, actor: str, memory: int) -> str | None:
    """Where a relaunch with `memory` seats the actor: a bundle of its role's group it fits in
    (its own first), or None: a group of its own."""
    if not state.spec.role(state.actors[actor].role).resources.memory:
        return None
    seat = ledger(state).choose(actor, memory)
    return seat_text(seat) if seat is not None else None


def growth_seats(state: JobState, names: Iterable[str]) -> dict[str, str]:
    """Seats for the ranks past the spec's a growth adds, one bundle each, in order, while free
    bundles fit them."""
    seats = dict(ledger(state).seats)
    out: dict[str, str] = {}
    for name in names:
        record = state.actors.get(name)
        if record is None or record.seat is not None or record.rank < state.spec.role(record.role).total:
            continue  # a rank of the spec comes back to its own bundle, kept for it
        seat = ledger(state, seats=seats).choose(name, None)
        if seat is not None:
            seats[name] = seat
            out[name] = seat_text(seat)
    return out


def free_bundles(state: JobState) -> list[FreeBundle]:
    """The bundles reserved for the job that no actor uses all of (none while no actor was
    relaunched: every actor sits where it was planned)."""
    if not any(a.memory is not None or a.seat is not None for a in state.actors.values()):
        return []
    found = ledger(state)
    gone = found.vacated()
    return [b for b in found.free() if b.group not in gone]


def left_lines(state: JobState, actor: str, seat: str | None = None) -> list[str]:
    """What a relaunch of `actor` left, from the group it sat in (its `seat` before, else its
    planned group): that group given back, or what of it stays reserved and unused."""
    found = ledger(state)
    group = parse_seat(seat)[0] if seat is not None else found.plans[actor].group
    if group in found.vacated():
        return [f"placement group {group} given back: no actor of the job is left in it"]
    return [b.text() for b in found.free() if b.group == group and group not in found.vacated()]
