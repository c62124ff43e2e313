"""Stall detection: a pure function of the job's state, what the PrimeMaster observed, and time.

A job where nothing moves (no training step, no heartbeat, no stage change, no item through a
data channel) for `health.stall_timeout_s` is reported once, with what waits on what (a
channel nobody writes, a rank that never reported), and again as resumed once anything moves.
It is a notice, never a failure: a slow job is not restarted for being slow (`hang_timeout_s`
is that opt-in rule). It never acts; `stall_watch.StallWatch` records what it returns.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from dlu_api.vocabulary import ActorStage, EventKind
from dlu_prime.master.state import SUB_MASTER_RANK, JobState
from dlu_prime.scheduler.base import ActorObservation

STALLED = EventKind.STALLED
RESUMED = EventKind.PROGRESS_RESUMED


@dataclass(frozen=True)
class ChannelView:
    """One data channel as its actor last answered `watch()`."""

    name: str
    put: int = 0
    delivered: int = 0
    queued: int = 0
    closed: bool = False
    waiting_puts: int = 0
    getters: tuple[str, ...] = ()  # consumer ids waiting in a get

    @staticmethod
    def from_watch(name: str, answer: Mapping[str, object]) -> ChannelView:
        def count(key: str) -> int:
            value = answer.get(key)
            return value if isinstance(value, int) else 0

        getters = answer.get("getters")
        return ChannelView(
            name=name,
            put=count("put"),
            delivered=count("delivered"),
            queued=count("queued"),
            closed=bool(answer.get("closed")),
            waiting_puts=count("waiting_puts"),
            getters=tuple(str(g) for g in getters) if isinstance(getters, list | tuple) else (),  # pyright: ignore[reportUnknownVariableType, reportUnknownArgumentType]
        )


Marks = tuple[object, ...]


@dataclass(frozen=True)
class StallMemory:
    """What the last pass saw: the progress marks, since when nothing has moved, and whether
    this stall was reported already (once per stall)."""

    marks: Marks | None = None
    since: float = 0.0
    reported: bool = False


def progress_marks(state: JobState, channels: Mapping[str, ChannelView]) -> Marks:
    """What changes when the job moves, besides the ranks' steps and beats (`latest_move`): how
    many actors are in each stage, the channels (created, a reader arriving, an item put or
    delivered, closed), and the restart counters. Small, whatever the job's size."""
    stages: dict[ActorStage, int] = {}
    for record in state.actors.values():
        stages[record.stage] = stages.get(record.stage, 0) + 1
    # A channel created, or a reader arriving at one, is the job moving too.
    flows = [(c.name, c.put, c.delivered, c.closed, c.getters) for _, c in sorted(channels.items())]
    restarts = (
        state.job_restart_count,
        state.global_restart_count,
        state.node_restart_count,
        state.master_restart_count,
        tuple((r.restart_count, r.inplace_restart_count, r.resize_count) for r in state.roles.values()),
    )
    return (tuple(sorted(stages.items())), tuple(state.channels), tuple(flows), restarts, state.stage)


def latest_move(
    state: JobState,
    steps: Mapping[str, tuple[int, float]],
    beats: Mapping[str, tuple[int, float]],
) -> float | None:
    """When a worker's step or beat count last moved (the monitor's liveness memory, on its
    clock: `track_steps`, `track_beats`). A SubMaster's beats are its serving loop's liveness,
    not progress, so they are left out."""
    latest: float | None = None
    for _, at in steps.values():
        if latest is None or at > latest:
            latest = at
    actors = state.actors
    for name, (_, at) in beats.items():
        if (
            (latest is None or at > latest)
            and (record := actors.get(name))
            and record.rank != SUB_MASTER_RANK
        ):
            latest = at
    return latest


def judge(
    memory: StallMemory,
    marks: Marks,
    moved_at: float | None,
    now: float,
    timeout: float | None,
    busy: bool = False,
) -> tuple[StallMemory, bool | None]:
    """One pass: the new memory, and True when a stall begins now, False when a reported one
    ends now, None otherwise. Progress is a change of `marks`, or a step or beat that moved
    (`moved_at`) after the stall's start; `busy` (a recovery or resize under way) counts too."""
    if timeout is None:
        return StallMemory(marks, now), None
    moved = moved_at is not None and moved_at > memory.since
    if busy or memory.marks is None or marks != memory.marks or moved:
        return StallMemory(marks, now), (False if memory.reported else None)
    if not memory.reported and now - memory.since >= timeout:
        return StallMemory(marks, memory.since, reported=True), True
    return memory, None


def _ranks(ranks: list[int]) -> str:
    ranks = sorted(ranks)
    return f"rank {ranks[0]}" if len(ranks) == 1 else "ranks " + ",".join(str(r) for r in ranks)


def _who(state: JobState, consumers: tuple[str, ...]) -> str:
    """Consumer ids as roles and ranks where they are the job's workers (`consumer_id()`)."""
    by_role: dict[str, list[int]] = {}
    others: list[str] = []
    for consumer in consumers:
        record = state.actors.get(consumer)
        if record is None:
            others.append(repr(consumer))
        else:
            by_role.setdefault(record.role, []).append(record.rank)
    named = [f"{role} {_ranks(ranks)}" for role, ranks in sorted(by_role.items())]
    return ", ".join(named + others)


def waits(
    state: JobState, observations: Mapping[str, ActorObservation], channels: Mapping[str, ChannelView]
) -> list[str]:
    """What waits on what, one phrase each: empty channels with readers waiting, full ones with
    writers waiting, ranks not running, ranks whose step stands, and ranks that never reported a
    step where a peer of their role did. A role none of whose ranks ever reports a step (an
    unmodified torchrun script never calls `heartbeat`) says nothing about its progress, so its
    silence is no finding: an empty list means there is nothing to name, and nothing is said."""
    out: list[str] = []
    waiting: set[str] = set()
    for _, view in sorted(channels.items()):
        if view.getters and not view.queued and not view.closed:
            waiting.update(view.getters)
            written = "nobody has written to it" if view.put == 0 else f"nothing new put ({view.put} so far)"
            out.append(f"{_who(state, view.getters)} wait(s) on channel {view.name!r}: {written}")
        elif view.waiting_puts and view.queued:
            out.append(
                f"{view.waiting_puts} writer(s) wait on channel {view.name!r}: full ({view.queued} queued), "
                "nobody reads it"
            )
    silent: dict[str, list[int]] = {}
    reporting: set[str] = set()
    standing: dict[tuple[str, int], list[int]] = {}
    pending: dict[tuple[str, str], int] = {}
    for name, record in state.actors.items():
        if record.rank == SUB_MASTER_RANK or name in waiting:
            continue
        seen = observations.get(name)
        stage = seen.stage if seen is not None else record.stage
        if stage is None:
            continue
        if stage in (ActorStage.INIT, ActorStage.READY):
            key = (record.role, stage.value)
            pending[key] = pending.get(key, 0) + 1
        elif stage is ActorStage.RUNNING and seen is not None:
            if not seen.steps_reported and seen.step == 0:
                silent.setdefault(record.role, []).append(record.rank)
            else:
                reporting.add(record.role)
                standing.setdefault((record.role, seen.step), []).append(record.rank)
    for (role, stage), count in sorted(pending.items()):
        out.append(f"{role}: {count} actor(s) still {stage}")
    for role, ranks in sorted(silent.items()):
        if role not in reporting:
            continue
        out.append(f"{role} {_ranks(ranks)} never reported a step (heartbeat(step) reports progress)")
    for (role, step), ranks in sorted(standing.items()):
        out.append(f"{role} {_ranks(ranks)} at step {step}")
    return out


def describe(found: list[str], idle_s: float, timeout: float) -> str:
    """The notice for a stall whose findings (`waits`) are `found`."""
    return (
        f"no progress for {idle_s:.0f}s (health.stall_timeout_s {timeout:g}): "
        + "; ".join(found)
        + " (a notice, not a failure: nothing is restarted)"
    )
