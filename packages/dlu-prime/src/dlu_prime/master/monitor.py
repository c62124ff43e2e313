"""The monitoring policy: a pure function from (state, observations, time) to a decision.

It never acts. The PrimeManager applies what it returns, so the rules are testable with no Ray
and no clock.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from dlu_api.vocabulary import ActorStage, FailureKind
from dlu_prime.master.state import SUB_MASTER_RANK, JobState
from dlu_prime.scheduler.base import ActorObservation


@dataclass(frozen=True)
class Failure:
    """Something went wrong with one actor. `kind` is what detected it."""

    actor: str
    role: str
    kind: FailureKind
    message: str
    node_id: str | None = None
    unreplaced: bool = False
    """A fault of its own of an actor the saved failover in flight has yet to replace, seen by a
    rebuilt PrimeMaster before resuming it (`failover_chain.replaced_seen`): not the failover's."""


@dataclass(frozen=True)
class Assessment:
    """Stage changes to record, failures seen, and whether every driver role has finished."""

    stage_changes: dict[str, ActorStage] = field(default_factory=dict[str, ActorStage])
    node_changes: dict[str, str] = field(default_factory=dict[str, str])
    failures: tuple[Failure, ...] = ()
    finished_roles: tuple[str, ...] = ()
    all_drivers_finished: bool = False
    errors_seen: dict[str, int] = field(default_factory=dict[str, int])


def assess(
    state: JobState,
    observations: Mapping[str, ActorObservation],
    now: float,
    steps_seen: Mapping[str, tuple[int, float]] | None = None,
    unavailable_since: Mapping[str, float] | None = None,
    beats_seen: Mapping[str, tuple[int, float]] | None = None,
) -> Assessment:
    """Judge one monitoring pass.

    Each actor is judged by the signals it produces: every actor by its poll (dead, FAILED,
    pushed errors); an actor that sends beats of its own (`watched`: a SubMaster's serving loop,
    user code calling `heartbeat()`) also by their staleness; one that reports training steps
    also by hangs (SubMasters train nothing). An elastic rank's agent watches its training
    process itself, so the rank's actor is judged by its poll alone.

    `beats_seen` and `steps_seen` map actor -> (last count, time it last moved on this clock),
    kept by the caller (`track_beats`, `track_steps`); without them staleness and hangs are not
    judged. `unavailable_since` (see `track_unavailable`) says since when Ray has been
    restarting an actor: that is not a failure until it outlasts the heartbeat timeout, because
    the reconstructed actor reports itself.
    """
    health = state.spec.health
    timeout = health.heartbeat_timeout_s
    hang_timeout = health.hang_timeout_s if steps_seen is not None else None
    steps = steps_seen or {}
    beats = beats_seen or {}
    since_unavailable = unavailable_since or {}
    init, running, failed = ActorStage.INIT, ActorStage.RUNNING, ActorStage.FAILED
    stage_changes: dict[str, ActorStage] = {}
    node_changes: dict[str, str] = {}
    failures: list[Failure] = []
    errors_seen: dict[str, int] = {}
    seen_of = observations.get
    # The healthy path of this loop runs 10,000 times a pass: locals, no work for healthy actors.
    for name, record in state.actors.items():
        seen = seen_of(name)
        if seen is None:
            continue
        stage = seen.stage
        if seen.unavailable:
            since = since_unavailable.get(name, now)
            if now - since > timeout:
                message = f"unavailable for {now - since:.0f}s (timeout {timeout:g}s): {seen.error}"
                failures.append(
                    Failure(
                        name, record.role, FailureKind.UNAVAILABLE, message, record.node_id or seen.node_id
                    )
                )
            continue
        if stage is None:
            failures.append(
                Failure(
                    name,
                    record.role,
                    FailureKind.DIED,
                    seen.error or "actor died",
                    record.node_id or seen.node_id,
                )
            )
            continue
        recorded = record.stage
        seen_node = seen.node_id
        node = record.node_id
        if seen.reconstructed and stage is init and recorded is not init:
            where = f" on node {seen_node[:12]}" if seen_node else ""
            message = f"actor process died; Ray reconstructed it{where}"
            failures.append(Failure(name, record.role, FailureKind.RESTARTED, message, node or seen_node))
            continue
        if seen_node and seen_node != node:
            node_changes[name] = seen_node
        if stage is not recorded:
            stage_changes[name] = stage
        if stage is failed:
            failures.append(
                Failure(name, record.role, FailureKind.FAILED, seen.error or "failed", node or seen_node)
            )
            continue
        reported = seen.reported_errors
        if reported and len(reported) > record.errors_seen:
            errors_seen[name] = len(reported)
            failures.append(
                Failure(
                    name,
                    record.role,
                    FailureKind.ERROR_REPORT,
                    reported[record.errors_seen],
                    node or seen_node,
                )
            )
        if stage is not running:
            continue
        if not seen.watched:
            continue
        beat = beats.get(name)
        if beat is not None and now - beat[1] > timeout:
            failures.append(
                Failure(
                    name,
                    record.role,
                    FailureKind.HEARTBEAT_TIMEOUT,
                    f"no heartbeat for {now - beat[1]:.0f}s (timeout {timeout:g}s)",
                    node or seen_node,
                )
            )
        elif hang_timeout is not None and seen.steps_reported and record.rank != SUB_MASTER_RANK:
            moved = steps.get(name)
            if moved is not None and now - moved[1] > hang_timeout:
                failures.append(
                    Failure(
                        name,
                        record.role,
                        FailureKind.HANG,
                        f"training step stuck at {seen.step} for {now - moved[1]:.0f}s "
                        f"(hang timeout {hang_timeout:g}s)",
                        node or seen_node,
                    )
                )

    # One walk over the actors (not one per role): roles with workers, and those not all finished.
    with_workers: set[str] = set()
    unfinished: set[str] = set()
    for record in state.actors.values():
        if record.rank == SUB_MASTER_RANK:
            continue
        with_workers.add(record.role)
        if stage_changes.get(record.name, record.stage) is not ActorStage.FINISH:
            unfinished.add(record.role)
    finished_roles = [r.name for r in state.spec.roles if r.name in with_workers and r.name not in unfinished]
    drivers = [r.name for r in state.spec.roles if r.is_driver]
    return Assessment(
        stage_changes=stage_changes,
        node_changes=node_changes,
        failures=tuple(failures),
        finished_roles=tuple(finished_roles),
        all_drivers_finished=bool(drivers) and all(d in finished_roles for d in drivers),
        errors_seen=errors_seen,
    )


def track_steps(
    previous: Mapping[str, tuple[int, float]],
    observations: Mapping[str, ActorObservation],
    now: float,
) -> dict[str, tuple[int, float]]:
    """Remember when each actor's step last moved, for hang detection."""
    out = dict(previous)
    for name, seen in observations.items():
        if seen.stage is not ActorStage.RUNNING or (seen.watched and not seen.steps_reported):
            out.pop(name, None)
            continue
        last = out.get(name)
        if last is None or last[0] != seen.step:
            out[name] = (seen.step, now)
    return out


def track_beats(
    previous: Mapping[str, tuple[int, float]],
    observations: Mapping[str, ActorObservation],
    now: float,
) -> dict[str, tuple[int, float]]:
    """Remember when each watched actor's beat count last moved, on this clock (no remote
    timestamps: nodes' clocks may drift apart over a week). An actor not watched is forgotten,
    so a pause (a rank in a rendezvous) never counts against the next phase."""
    out: dict[str, tuple[int, float]] = {}
    for name, seen in observations.items():
        if seen.stage is not ActorStage.RUNNING or not seen.watched:
            continue
        last = previous.get(name)
        out[name] = last if last is not None and last[0] == seen.beats else (seen.beats, now)
    return out


def track_unavailable(
    previous: Mapping[str, float], observations: Mapping[str, ActorObservation], now: float
) -> dict[str, float]:
    """Remember since when each actor has been unavailable (Ray restarting it)."""
    out = {name: since for name, since in previous.items() if name in observations}
    for name, seen in observations.items():
        if seen.unavailable:
            out.setdefault(name, now)
        elif out:
            out.pop(name, None)
    return out
