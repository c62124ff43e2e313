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
    kind: str  # "died", "failed", "error_report", "heartbeat_timeout", "hang"
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


def _first_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1] if lines else text


def assess(
    state: JobState,
    observations: Mapping[str, ActorObservation],
    now: float,
    steps_seen: Mapping[str, tuple[int, float]] | None = None,
) -> Assessment:
    """Judge one monitoring pass.

    `steps_seen` maps actor -> (last step, time it last changed), kept by the caller, for hang
    detection; without it hangs are not judged.
    """
    health = state.spec.health
    stage_changes: dict[str, ActorStage] = {}
    node_changes: dict[str, str] = {}
    failures: list[Failure] = []
    for name, record in state.actors.items():
        seen = observations.get(name)
        if seen is None:
            continue
        if seen.node_id and seen.node_id != record.node_id:
            node_changes[name] = seen.node_id
        node = seen.node_id or record.node_id
        if seen.stage is None:
            failures.append(Failure(name, record.role, "died", seen.error or "actor died", node))
            continue
        if seen.stage != record.stage:
            stage_changes[name] = seen.stage
        if seen.stage is ActorStage.FAILED:
            failures.append(Failure(name, record.role, "failed", seen.error or "failed", node))
            continue
        for message in seen.reported_errors:
            failures.append(Failure(name, record.role, "error_report", message, node))
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
