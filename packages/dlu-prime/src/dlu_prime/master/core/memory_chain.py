"""A memory relaunch as a chain of decisions: an actor near its memory limit replaced with more
memory through the role tier's own steps, but not as a fault (nothing counted, no budget used).

decided (autoscale_pass)  RelaunchBegan saved (memory_relaunch, the override and the seat, a
                          bundle of its role's group it fits in (`master.bundles`), on the
                          actor's record) -> SetMemory, SetSeats -> the role tier's replacement:
  with a SubMaster        SubMasterFailover (it calls `restart_actors` back: not counted, the
                          actor is the relaunch's) -> RelaunchEnded (memory_relaunch_done)
  without one             ReplaceActors -> StartActors -> RelaunchEnded
  a failed step           RelaunchFailed (memory_relaunch_failed; the old memory back on the
                          record) -> SetMemory(old) -> the same steps again -> RelaunchEnded;
                          failing again: RelaunchEnded(error), the monitor judges the actor
rebuilt PrimeMaster       SetSeats(every seat), SetMemory(every override) [+ the relaunch in
                          flight from its first step]

The relaunch in flight (`state.relaunch`) is saved before its first step, so no failover,
resize or other relaunch begins meanwhile, and a rebuilt PrimeMaster carries it on. Pure.
"""

from __future__ import annotations

from dlu_api.vocabulary import ActorStage
from dlu_prime.autoscale.memory import MemoryDecision
from dlu_prime.master.bundles import relaunch_seat
from dlu_prime.master.change_types import ActorsPlaced
from dlu_prime.master.core.commands import (
    Command,
    Purpose,
    ReplaceActors,
    SetMemory,
    SetSeats,
    StartActors,
    SubMasterFailover,
)
from dlu_prime.master.core.decision import Decision
from dlu_prime.master.core.events import Done
from dlu_prime.master.relaunch import RelaunchBegan, RelaunchEnded, RelaunchFailed, overrides
from dlu_prime.master.state import SUB_MASTER_RANK, JobState, RelaunchRecord


def begin(state: JobState, decision: MemoryDecision, now: float) -> Decision:
    record = RelaunchRecord(
        actor=decision.actor,
        role=decision.role,
        old_memory=decision.old,
        new_memory=decision.new,
        reason=decision.reason,
        started_at=now,
        seat=relaunch_seat(state, decision.actor, decision.new),
        old_seat=state.actors[decision.actor].seat,
    )
    memory = SetMemory({record.actor: record.new_memory})
    moves = (SetSeats({record.actor: record.seat}),) if record.seat != record.old_seat else ()
    return Decision((RelaunchBegan(record),), (memory, *moves, _replace(state, record)))


def rebuilt(state: JobState) -> tuple[Command, ...]:
    """What a rebuilt PrimeMaster tells its scheduler first: every actor's memory override, and
    the relaunch in flight carried on from its first step (each step is idempotent)."""
    memory = overrides(state)
    seats: dict[str, str | None] = {n: a.seat for n, a in state.actors.items() if a.seat is not None}
    commands: list[Command] = [SetSeats(seats)] if seats else []
    commands += [SetMemory(memory)] if memory else []
    record = state.relaunch
    if record is not None and record.actor in state.actors:
        commands.append(_replace(state, record))
    return tuple(commands)


def _replace(state: JobState, record: RelaunchRecord) -> Command:
    """The role tier's replacement of the actor: through its role's SubMaster where it has one."""
    sub = [n for n, a in state.actors.items() if a.role == record.role and a.rank == SUB_MASTER_RANK]
    if sub:
        return SubMasterFailover(sub[0], (record.actor,), record.reason, purpose=Purpose.MEMORY)
    return ReplaceActors((record.actor,), Purpose.MEMORY)


def after(state: JobState, done: Done) -> Decision:
    """The outcome of one step of the relaunch in flight."""
    record = state.relaunch
    if record is None:
        return Decision()
    if done.error is not None:
        if record.error is not None:
            return Decision((RelaunchEnded(done.error_text),))
        back = record.model_copy(update={"new_memory": record.old_memory, "seat": record.old_seat})
        return Decision(
            (RelaunchFailed(done.error_text),),
            (
                SetMemory({record.actor: record.old_memory}),
                *((SetSeats({record.actor: record.old_seat}),) if record.seat != record.old_seat else ()),
                _replace(state, back),
            ),
        )
    match done.command:
        case ReplaceActors(names=names):
            placed = ActorsPlaced(dict(done.value or {}), ActorStage.READY, fresh=True)
            return Decision((placed,), (StartActors(names, Purpose.MEMORY),))
        case _:
            return Decision((RelaunchEnded(),))


def covers(state: JobState, names: tuple[str, ...]) -> bool:
    """`names` are the actor of the relaunch in flight (its SubMaster asks to replace it)."""
    record = state.relaunch
    return record is not None and set(names) <= {record.actor}
