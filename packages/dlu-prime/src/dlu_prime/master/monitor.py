"""The monitoring policy: a pure function from (state, observations, time) to a decision.

It never acts. The PrimeManager applies what it returns, so the rules are testable with no Ray
and no clock.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from dlu_prime.master.state import SUB_MASTER_RANK, ActorStage, JobState
from dlu_prime.scheduler.base import ActorObservation


@dataclass(frozen=True)
class Failure:
    """Something went wrong with one actor. `kind` is what detected it."""

    actor: str
    role: str
    kind: str  # "died", "restarted", "unavailable", "failed", "error_report", "heartbeat_timeout", "hang"
    message: str
    node_id: str | None = None


@dataclass(frozen=True)
class Assessment:
    """Stage changes to record, failures seen, and whether every driver role has finished."""

    stage_changes: dict[str, ActorStage] = field(default_factory=dict[str, ActorStage])
    node_changes: dict[str, str] = field(default_factory=dict[str, str])
    failures: tuple[Failure, ...] = ()
    finished_roles: tuple[str, ...] = ()
    all_drivers_finished: bool = False
    errors_seen: dict[str, int] = field(default_factory=dict[str, int])


def _first_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1] if lines else text


def assess(
    state: JobState,
    observations: Mapping[str, ActorObservation],
    now: float,
    steps_seen: Mapping[str, tuple[int, float]] | None = None,
    unavailable_since: Mapping[str, float] | None = None,
) -> Assessment:
    """Judge one monitoring pass.

    `steps_seen` maps actor -> (last step, time it last changed), kept by the caller, for hang
    detection; without it hangs are not judged. `unavailable_since` (see `track_unavailable`)
    says since when Ray has been restarting an actor: that is not a failure until it outlasts
    the heartbeat timeout, because the reconstructed actor reports itself.
    """
    health = state.spec.health
    stage_changes: dict[str, ActorStage] = {}
    node_changes: dict[str, str] = {}
    failures: list[Failure] = []
    errors_seen: dict[str, int] = {}
    for name, record in state.actors.items():
        seen = observations.get(name)
        if seen is None:
            continue
        node = record.node_id or seen.node_id
        if seen.unavailable:
            since = (unavailable_since or {}).get(name, now)
            if now - since > health.heartbeat_timeout_s:
                message = f"unavailable for {now - since:.0f}s (timeout {health.heartbeat_timeout_s:g}s): {seen.error}"
                failures.append(Failure(name, record.role, "unavailable", message, node))
            continue
        if seen.stage is None:
            failures.append(Failure(name, record.role, "died", seen.error or "actor died", node))
            continue
        if seen.reconstructed and seen.stage is ActorStage.INIT and record.stage is not ActorStage.INIT:
            where = f" on node {seen.node_id[:12]}" if seen.node_id else ""
            message = f"actor process died; Ray reconstructed it{where}"
            failures.append(Failure(name, record.role, "restarted", message, node))
            continue
        if seen.node_id and seen.node_id != record.node_id:
            node_changes[name] = seen.node_id
        if seen.stage != record.stage:
            stage_changes[name] = seen.stage
        if seen.stage is ActorStage.FAILED:
            failures.append(Failure(name, record.role, "failed", seen.error or "failed", node))
            continue
        new_errors = seen.reported_errors[record.errors_seen :]
        if new_errors:
            errors_seen[name] = len(seen.reported_errors)
            failures.append(Failure(name, record.role, "error_report", new_errors[0], node))
        if seen.stage is not ActorStage.RUNNING:
            continue
        if seen.last_heartbeat is not None and now - seen.last_heartbeat > health.heartbeat_timeout_s:
            failures.append(
                Failure(
                    name,
                    record.role,
                    "heartbeat_timeout",
                    f"no heartbeat for {now - seen.last_heartbeat:.0f}s (timeout {health.heartbeat_timeout_s:g}s)",
                    node,
                )
            )
        elif health.hang_timeout_s is not None and steps_seen is not None and name in steps_seen:
            _, since = steps_seen[name]
            if now - since > health.hang_timeout_s:
                failures.append(
                    Failure(
                        name,
                        record.role,
                        "hang",
                        f"training step stuck at {seen.step} for {now - since:.0f}s "
                        f"(hang timeout {health.hang_timeout_s:g}s)",
                        node,
                    )
                )

    finished_roles: list[str] = []
    for role in state.spec.roles:
        stages = [
            stage_changes.get(a.name, a.stage)
            for a in state.actors.values()
            if a.role == role.name and a.rank != SUB_MASTER_RANK
        ]
        if stages and all(s is ActorStage.FINISH for s in stages):
            finished_roles.append(role.name)
    drivers = [r.name for r in state.spec.roles if r.is_driver]
    return Assessment(
        stage_changes=stage_changes,
        node_changes=node_changes,
        failures=tuple(failures),
        finished_roles=tuple(finished_roles),
        all_drivers_finished=bool(drivers) and all(d in finished_roles for d in drivers),
        errors_seen=errors_seen,
    )


def failure_reason(failure: Failure) -> str:
    """A one-paragraph reason for the job's status, with the traceback's last line up front."""
    summary = _first_line(failure.message)
    where = f" on node {failure.node_id[:12]}" if failure.node_id else ""
    return f"{failure.actor} ({failure.kind}{where}): {summary}\n{failure.message}".rstrip()


def track_steps(
    previous: Mapping[str, tuple[int, float]],
    observations: Mapping[str, ActorObservation],
    now: float,
) -> dict[str, tuple[int, float]]:
    """Remember when each actor's step last moved, for hang detection."""
    out = dict(previous)
    for name, seen in observations.items():
        if seen.stage is not ActorStage.RUNNING:
            out.pop(name, None)
            continue
        last = out.get(name)
        if last is None or last[0] != seen.step:
            out[name] = (seen.step, now)
    return out


def track_unavailable(
    previous: Mapping[str, float], observations: Mapping[str, ActorObservation], now: float
) -> dict[str, float]:
    """Remember since when each actor has been unavailable (Ray restarting it)."""
    out = {name: since for name, since in previous.items() if name in observations}
    for name, seen in observations.items():
        if seen.unavailable:
            out.setdefault(name, now)
        else:
            out.pop(name, None)
    return out
