"""The job's stage machine and what a fresh or resumed run starts from: the allowed stage moves,
exit codes, the errors the PrimeManager raises, and pure helpers over the state."""

from __future__ import annotations

from dlu_api.spec.models import JobSpec
from dlu_api.status import JobStage
from dlu_api.vocabulary import ActorStage
from dlu_prime.master.state import SUB_MASTER_RANK, ActorRecord, JobState, RoleRecord
from dlu_prime.master.tiers import exceeds
from dlu_prime.naming import sub_master_name
from dlu_prime.roles import sub_master_path
from dlu_prime.scheduler.base import ActorObservation
from dlu_prime.scheduler.placement import plan_placement

ALLOWED: dict[JobStage, frozenset[JobStage]] = {
    JobStage.INIT: frozenset({JobStage.READY, JobStage.STOPPING}),
    JobStage.READY: frozenset({JobStage.RUNNING, JobStage.STOPPING}),
    JobStage.RUNNING: frozenset({JobStage.INIT, JobStage.STOPPING}),
    JobStage.STOPPING: frozenset({JobStage.STOPPED}),
    JobStage.STOPPED: frozenset(),
    JobStage.LOST: frozenset(),  # a client's reading of a local job whose process died; never entered
}

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_STOPPED = 130


class FencedError(Exception):
    """Another PrimeMaster wrote the job's state after us: this one must stop acting."""


class ResumeError(Exception):
    """A stored job cannot be resumed; the message says why."""


class RestartLimitError(Exception):
    """A restart would exceed a limit; the message names the limit and the culprit."""


class IllegalTransition(Exception):
    """A stage change the machine does not allow (a bug, never user input)."""


def new_state(spec: JobSpec) -> JobState:
    """A fresh state with a record for every role and actor of the placement plan."""
    state = JobState(spec=spec)
    for role in spec.roles:
        state.roles[role.name] = RoleRecord(name=role.name)
    for plan in plan_placement(spec).actors:
        state.actors[plan.name] = ActorRecord(name=plan.name, role=plan.role, rank=plan.rank)
    for role in spec.roles:
        if sub_master_path(role) is not None:
            name = sub_master_name(spec.name, role.name)
            state.actors[name] = ActorRecord(name=name, role=role.name, rank=SUB_MASTER_RANK)
    return state


def resumed_state(spec: JobSpec, old: JobState) -> JobState:
    """A job-level restart of a stored run: fresh actors, the old counters, budgets and timeline."""
    state = new_state(spec)
    state.job_restart_count = old.job_restart_count + 1
    state.global_restart_count = old.global_restart_count
    state.master_restart_count = old.master_restart_count
    state.node_restart_count = old.node_restart_count
    state.removed_nodes = list(old.removed_nodes)
    state.node_failures = dict(old.node_failures)
    for name, record in old.roles.items():
        if name in state.roles:
            state.roles[name].restart_count = record.restart_count
    for name, amount in kept_memory(spec, old).items():
        state.actors[name].memory = amount
    # The timeline continues: its numbering too (a reader that asks for the events after N
    # must never see a resumed run's events reuse the numbers of the stored run's).
    state.events = list(old.events)
    state.event_seq = old.event_seq
    state.first_failure = old.first_failure
    return state


def kept_memory(spec: JobSpec, old: JobState) -> dict[str, int]:
    """The memory overrides of the stored run that the resumed one keeps: an actor that needed
    more memory needs it again. Kept for an actor of the same role in the new run, while its
    role still asks for memory and less than the override (a spec that asks for as much or more
    now, or for none, decides)."""
    fresh = {a.name: a.role for a in plan_placement(spec).actors}
    kept: dict[str, int] = {}
    for name, record in old.actors.items():
        if record.memory is None or fresh.get(name) != record.role:
            continue
        asked = spec.role(record.role).resources.memory
        if 0 < asked < record.memory:
            kept[name] = record.memory
    return kept


def resume_problem(spec: JobSpec, old: JobState | None) -> str | None:
    """Why a stored job cannot be resumed, or None if it can."""
    if old is None:
        return f"job {spec.name}: no stored state in store {spec.state_store.name!r} to resume"
    if old.stage is JobStage.STOPPED and old.exit_code == EXIT_OK:
        return f"job {spec.name} already finished successfully; submit it as a new job"
    limit = spec.limits.job_max_restart
    if exceeds(old.job_restart_count, limit):  # the new spec's limit: raising it allows a resume
        return (
            f"job {spec.name}: job_max_restart={limit} reached ({old.job_restart_count} restarts); "
            "raise limits.job_max_restart to resume it"
        )
    return None


def gone(seen: ActorObservation) -> bool:
    """Dead, being rebuilt by Ray, or rebuilt and not set up yet: a fault to be handled."""
    return seen.stage is None or (seen.reconstructed and seen.stage is ActorStage.INIT)


def sub_masters(state: JobState) -> list[str]:
    return [n for n, a in state.actors.items() if a.rank == SUB_MASTER_RANK]


def start_targets(state: JobState) -> list[str]:
    """Who the PrimeManager starts: SubMasters, and the workers of roles without one."""
    driven = {a.role for a in state.actors.values() if a.rank == SUB_MASTER_RANK}
    return [n for n, a in state.actors.items() if a.rank == SUB_MASTER_RANK or a.role not in driven]


def unstarted(state: JobState) -> list[str]:
    """Actors saved READY but never started (a PrimeMaster died between save and start); those
    of an in-flight failover are the failover's to start."""
    busy = set(state.failover.actors) if state.failover else set[str]()
    targets = set(start_targets(state))
    return [
        n for n, a in state.actors.items() if a.stage is ActorStage.READY and n not in busy and n in targets
    ]
