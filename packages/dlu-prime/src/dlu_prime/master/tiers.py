"""The tier table: each rung of the failover ladder in one entry (detection, counter, limit,
metric, escalation). The failover policy, the counts (`changes.count`), the runner's escalation
(`recovery.resume`) and the metrics (`metrics.TIER_COUNTS`) all read it; "count + 1 > limit" is
written once (`over_limit`). Adding a tier is one entry here plus the command that runs it.

Budgets that are not tiers of their own (the job-level restarts' global budget) are entries too,
so a limit check is always `over_limit(state, budget, role)`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import StrEnum

from dlu_api.vocabulary import Tier
from dlu_prime.master.state import JobState


class Budget(StrEnum):
    """What a restart is charged to: one counter against one limit."""

    IN_PLACE = "in_place"
    ROLE = "role"
    SUB_MASTER = "sub_master"
    JOB = "job"
    GLOBAL = "global"
    NODE = "node"
    MASTER = "master"


@dataclass(frozen=True)
class Entry:
    """One budget: how its fault is detected (for the docs and reasons), how to read its count
    and its limit (per role where `per_role`), the limit's field name, and the tier its recovery
    escalates to when it fails (None: the job stops)."""

    budget: Budget
    detection: str
    count: Callable[[JobState, str | None], int]
    limit: Callable[[JobState, str | None], int]
    limit_field: str
    per_role: bool
    escalation: Tier | None
    charge: Callable[[JobState, str | None, Sequence[str]], None]


def _role(state: JobState, role: str | None) -> str:
    if role is None:
        raise ValueError("a per-role budget needs the role")
    return role


def _charge_in_place(state: JobState, role: str | None, actors: Sequence[str]) -> None:
    state.roles[_role(state, role)].inplace_restart_count += 1


def _charge_role(state: JobState, role: str | None, actors: Sequence[str]) -> None:
    record = state.roles[_role(state, role)]
    record.restart_count += 1
    record.escalation_count += 1
    for name in actors:
        state.actors[name].restart_count += 1


def _charge_sub_master(state: JobState, role: str | None, actors: Sequence[str]) -> None:
    state.roles[_role(state, role)].sub_master_restart_count += 1


def _charge_job(state: JobState, role: str | None, actors: Sequence[str]) -> None:
    state.job_restart_count += 1
    state.global_restart_count += 1  # every job-level restart spends the global budget too
    for record in state.roles.values():
        record.escalation_count = 0


def _charge_global(state: JobState, role: str | None, actors: Sequence[str]) -> None:
    state.global_restart_count += 1


def _charge_node(state: JobState, role: str | None, actors: Sequence[str]) -> None:
    state.node_restart_count += 1


def _charge_master(state: JobState, role: str | None, actors: Sequence[str]) -> None:
    state.master_restart_count += 1


TABLE: dict[Budget, Entry] = {
    e.budget: e
    for e in (
        Entry(
            Budget.IN_PLACE,
            "a training process exits, raises, or its agent finds it silent or hung",
            lambda s, r: s.roles[_role(s, r)].inplace_restart_count,
            lambda s, r: s.spec.role(_role(s, r)).max_restart,
            "max_restart",
            True,
            None,
            _charge_in_place,
        ),
        Entry(
            Budget.ROLE,
            "a worker actor dies or is rebuilt by Ray; an error report; a stale heartbeat; a hang",
            lambda s, r: s.roles[_role(s, r)].restart_count,
            lambda s, r: s.spec.role(_role(s, r)).max_restart,
            "max_restart",
            True,
            Tier.JOB,
            _charge_role,
        ),
        Entry(
            Budget.SUB_MASTER,
            "a role's SubMaster dies or is rebuilt by Ray",
            lambda s, r: s.roles[_role(s, r)].sub_master_restart_count,
            lambda s, r: s.spec.role(_role(s, r)).max_restart,
            "max_restart",
            True,
            Tier.JOB,
            _charge_sub_master,
        ),
        Entry(
            Budget.JOB,
            "a role with the global policy, or at its escalate_after, or a failed role failover",
            lambda s, _r: s.job_restart_count,
            lambda s, _r: s.spec.limits.job_max_restart,
            "job_max_restart",
            False,
            None,
            _charge_job,
        ),
        Entry(
            Budget.GLOBAL,
            "every job-level restart (the health seed's global-restart budget)",
            lambda s, _r: s.global_restart_count,
            lambda s, _r: s.spec.limits.global_restart_budget,
            "global_restart_budget",
            False,
            None,
            _charge_global,
        ),
        Entry(
            Budget.NODE,
            "a node over its per_node_max_failure, relaunched by the Extension",
            lambda s, _r: s.node_restart_count,
            lambda s, _r: s.spec.limits.node_max_restart,
            "node_max_restart",
            False,
            None,
            _charge_node,
        ),
        Entry(
            Budget.MASTER,
            "the PrimeMaster rebuilt by Ray (it counts itself when it loads the state)",
            lambda s, _r: s.master_restart_count,
            lambda s, _r: s.spec.limits.master_max_restart,
            "master_max_restart",
            False,
            None,
            _charge_master,
        ),
    )
}

# The budget each tier's recovery is charged to.
CHARGED: dict[Tier, Budget] = {
    Tier.IN_PLACE: Budget.IN_PLACE,
    Tier.ROLE: Budget.ROLE,
    Tier.SUB_MASTER: Budget.SUB_MASTER,
    Tier.JOB: Budget.JOB,
    Tier.NODE: Budget.NODE,
    Tier.MASTER: Budget.MASTER,
}


def exceeds(count: int, limit: int, adding: int = 1) -> bool:
    """Whether `adding` more restarts on top of `count` pass `limit`: the one place
    "count + 1 > limit" is written."""
    return count + adding > limit


def over_limit(state: JobState, budget: Budget, role: str | None = None, adding: int = 1) -> bool:
    """Whether charging `adding` more restarts to `budget` would exceed its limit."""
    entry = TABLE[budget]
    return exceeds(entry.count(state, role), entry.limit(state, role), adding)


def limit_reached(state: JobState, budget: Budget, role: str | None = None, adding: int = 1) -> str | None:
    """`over_limit`, as the start of a stop reason naming the limit (None when within it)."""
    if not over_limit(state, budget, role, adding):
        return None
    entry = TABLE[budget]
    where = f"role {role} reached " if entry.per_role else ""
    return f"{where}{entry.limit_field}={entry.limit(state, role)}"


def charge(state: JobState, tier: Tier, role: str | None = None, actors: Sequence[str] = ()) -> None:
    """Count one recovery of `tier` on its budget (and what that budget's entry also spends)."""
    TABLE[CHARGED[tier]].charge(state, role, actors)


def escalation(tier: Tier) -> Tier | None:
    """What a failed recovery of `tier` escalates to (None: the job stops)."""
    return TABLE[CHARGED[tier]].escalation


def totals(state: JobState) -> dict[str, int]:
    """Restarts per budget over the whole job (the metrics' `tier` label)."""
    roles = list(state.roles)
    return {
        budget.value: sum(entry.count(state, r) for r in roles)
        if entry.per_role
        else entry.count(state, None)
        for budget, entry in TABLE.items()
    }
