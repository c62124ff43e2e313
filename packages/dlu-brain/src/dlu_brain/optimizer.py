"""The optimize processor (which algorithm answers an event) and the executor (run it, check the
plan fits the cluster, write it). Pure over what it is given: the job's shape, its measurements,
finished jobs' measurements and the cluster's free resources."""

from __future__ import annotations

import math
from dataclasses import dataclass

from dlu_api.spec.autoscale_settings import DEFAULT_BACKLOG_TARGET_S, DEFAULT_MARGINAL_THRESHOLD
from dlu_brain.administrator import Trigger
from dlu_prime.brain_port import RolePlan, RoleShape
from dlu_prime.stats import backlog_size, best_size, explore_scaling, memory_relaunch


@dataclass(frozen=True)
class OptimizerSettings:
    # a step up must keep this much of linear scaling: the job spec's default, so a job sizes
    # the same in cluster mode as in single-job mode
    linear_threshold: float = DEFAULT_MARGINAL_THRESHOLD
    # a backlog role drains its backlog in this long: the spec's default too; a job that sends
    # its own autoscale.backlog_target_s is planned with it
    backlog_target_s: float = DEFAULT_BACKLOG_TARGET_S
    memory_growth: float = 1.5
    memory_pressure: float = 0.9


@dataclass(frozen=True)
class JobFacts:
    roles: dict[str, RoleShape]
    sizes: dict[str, int]  # the size each role runs at now
    by_size: dict[str, dict[int, float]]  # this job's throughput per world size
    history: dict[str, dict[int, float]]  # finished jobs with the same signature
    backlog: dict[str, tuple[int, float]]  # role -> (items waiting, items/s per actor)
    unplaceable: set[tuple[str, int]]  # (role, size) the job could not place


def choose_algorithm(trigger: Trigger, shape: RoleShape | None, has_backlog: bool) -> str:
    """The processor's choice for an event."""
    if trigger.kind == "job_start":
        return "history_best_size"
    if trigger.kind == "memory_pressure":
        return "memory_relaunch"
    if has_backlog and shape is not None and not shape.elastic:
        return "backlog_sizing"
    return "marginal_scaling"


def plan_for(trigger: Trigger, facts: JobFacts, settings: OptimizerSettings) -> list[RolePlan]:
    """The executor's plans for one event (an empty list: nothing to change)."""
    if trigger.kind == "job_start":
        return _first_plans(facts, settings)
    role = trigger.role
    if role is None or role not in facts.roles:
        return []
    shape = facts.roles[role]
    algorithm = choose_algorithm(trigger, shape, role in facts.backlog)
    if algorithm == "memory_relaunch":
        used = int(trigger.detail.get("memory_bytes", 0))
        limit = int(trigger.detail.get("memory_limit_bytes", 0))
        memory = memory_relaunch(used, limit, settings.memory_pressure, settings.memory_growth)
        if memory is None:
            return []
        actor = trigger.detail.get("actor")
        reason = f"{actor} uses {used / 2**20:.0f} MiB of {limit / 2**20:.0f} MiB: relaunch with {memory / 2**20:.0f} MiB"
        return [RolePlan(role=role, memory_bytes=memory, algorithm=algorithm, reason=reason)]
    current = facts.sizes.get(role, shape.size)
    if algorithm == "backlog_sizing":
        waiting, rate = facts.backlog[role]
        decision = backlog_size(
            role, waiting, rate, settings.backlog_target_s, current, shape.min_size, shape.max_size
        )
    else:
        decision = explore_scaling(  # marginal scaling that also measures the size below
            role,
            facts.by_size.get(role, {}),
            current,
            shape.min_size,
            shape.max_size,
            settings.linear_threshold,
            elastic=shape.elastic,
            skip=frozenset(size for r, size in facts.unplaceable if r == role),
        )
    if not decision.changes or (role, decision.target) in facts.unplaceable:
        return []
    return [RolePlan(role=role, size=decision.target, algorithm=algorithm, reason=decision.reason)]


def _first_plans(facts: JobFacts, settings: OptimizerSettings) -> list[RolePlan]:
    plans: list[RolePlan] = []
    for role, shape in sorted(facts.roles.items()):
        measured = facts.history.get(role, {})
        size = best_size(measured, settings.linear_threshold, shape.min_size, shape.max_size)
        if size is None:
            continue
        unit = "nodes" if shape.elastic else "actors"
        shown = ", ".join(f"{n} {unit} {v:.1f}/s" for n, v in sorted(measured.items()))
        plans.append(
            RolePlan(
                role=role,
                size=size,
                algorithm="history_best_size",
                reason=f"{role} starts at {size}: best of finished runs with this signature ({shown}; "
                f"threshold {settings.linear_threshold:.0%} of linear)",
            )
        )
    return plans


def placement_problem(
    plan: RolePlan, shape: RoleShape, current: int, available: dict[str, float] | None
) -> str | None:
    """Why the cluster cannot hold the plan's added actors now, or None when it can (or when no
    cluster figures are known: the job then finds out and reports it)."""
    if plan.size is None or available is None or plan.size <= current:
        return None
    added = (plan.size - current) * shape.actors_per_unit
    short = [
        f"{name} needs {need * added:g}, {available.get(name, 0.0):g} free"
        for name, need in sorted(shape.actor_resources.items())
        if need > 0 and available.get(name, 0.0) + 1e-9 < need * added
    ]
    if not short:
        return None
    return f"{plan.role} {current} -> {plan.size} adds {added} actors: " + "; ".join(short)


def merge_history(runs: list[dict[int, float]]) -> dict[int, float]:
    """Finished runs' throughput per size, the newest run first: the newest measurement wins."""
    merged: dict[int, float] = {}
    for run in runs:
        for size, speed in run.items():
            if size not in merged and math.isfinite(speed):
                merged[size] = speed
    return merged
