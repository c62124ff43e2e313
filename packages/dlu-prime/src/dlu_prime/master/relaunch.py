"""A memory relaunch's changes to the state, and how they apply. Pure.

An actor near its memory limit is replaced with more memory (`autoscale.memory` decides,
`core.memory_chain` carries it out). It is not a fault: no failure, no restart count, no
budget; the timeline says it as `memory_relaunch` (with its inputs) and `memory_relaunch_done`,
as a resize says `resize_started` and `resize_done`. The new memory is saved on the actor's
record before it is replaced (`ActorRecord.memory`), so every later incarnation (a failover's,
a rebuilt PrimeMaster's) asks for it too. A replacement that fails (the bigger bundle cannot be
placed) is `memory_relaunch_failed`, and the actor is put back with its old memory.
"""

from __future__ import annotations

from dataclasses import dataclass

from dlu_api.spec.units import format_bytes
from dlu_api.vocabulary import ActorStage, EventKind
from dlu_prime.master.bundles import left_lines
from dlu_prime.master.state import JobState, RelaunchRecord

Line = tuple[EventKind, str, float | None]


@dataclass(frozen=True)
class RelaunchBegan:
    record: RelaunchRecord


@dataclass(frozen=True)
class RelaunchFailed:
    """The replacement with more memory failed: the actor goes back to its old memory."""

    error: str


@dataclass(frozen=True)
class RelaunchEnded:
    """The relaunch in flight is over (`error`: not even the old memory could be had back)."""

    error: str | None = None


def spec_memory(state: JobState, actor: str) -> int:
    """What the actor's role asks Ray for (0: no memory limit)."""
    return state.spec.role(state.actors[actor].role).resources.memory


def actor_memory(state: JobState, actor: str) -> int:
    """The memory the actor's incarnations ask for: its override, else its role's."""
    record = state.actors[actor]
    return record.memory if record.memory is not None else spec_memory(state, actor)


def overrides(state: JobState) -> dict[str, int]:
    """Every actor's memory override (what the scheduler is told after a PrimeMaster restart)."""
    return {name: a.memory for name, a in state.actors.items() if a.memory is not None}


def relaunch_began(state: JobState, change: RelaunchBegan) -> list[Line]:
    record = change.record
    actor = state.actors[record.actor]
    actor.memory = record.new_memory
    actor.memory_raised_at = record.started_at
    actor.stage = ActorStage.INIT
    actor.seat = record.seat
    state.relaunch = record
    state.relaunch_count += 1
    lines: list[Line] = [(EventKind.MEMORY_RELAUNCH, record.reason, None)]
    if record.seat is not None:
        group, _, index = record.seat.rpartition("#")
        message = (
            f"{record.actor} relaunched into bundle {index} of group {group}, which has room for "
            f"{format_bytes(record.new_memory)}: nothing more reserved"
        )
        lines.append((EventKind.BUNDLE_REUSED, message, None))
    return lines


def relaunch_failed(state: JobState, change: RelaunchFailed) -> list[Line]:
    record = state.relaunch
    if record is None or record.error is not None:
        return []
    state.relaunch = record.model_copy(update={"error": change.error})
    actor = state.actors.get(record.actor)
    if actor is not None:
        old = record.old_memory
        actor.memory = None if old == spec_memory(state, record.actor) else old
        actor.seat = record.old_seat
        actor.stage = ActorStage.INIT
    message = (
        f"memory relaunch of {record.actor} with {format_bytes(record.new_memory)} failed: "
        f"{change.error}; relaunching it with its old {format_bytes(record.old_memory)}"
    )
    return [(EventKind.MEMORY_RELAUNCH_FAILED, message, None)]


def relaunch_ended(state: JobState, change: RelaunchEnded, now: float) -> list[Line]:
    record = state.relaunch
    if record is None:
        return []
    state.relaunch = None
    took = now - record.started_at
    if change.error is not None:
        message = f"{record.actor} could not be relaunched with its old memory either: {change.error}"
        return [(EventKind.MEMORY_RELAUNCH_FAILED, message, None)]
    if record.error is not None:
        return [(EventKind.ACTORS_RESTARTED, f"{record.actor} relaunched with its old memory", took)]
    message = f"{record.actor} relaunched with {format_bytes(record.new_memory)} in {took:.2f}s"
    lines: list[Line] = [(EventKind.MEMORY_RELAUNCH_DONE, message, took)]
    if record.actor in state.actors:
        left = left_lines(state, record.actor, record.old_seat)
        lines += [(EventKind.BUNDLE_FREE, line, None) for line in left]
    return lines
