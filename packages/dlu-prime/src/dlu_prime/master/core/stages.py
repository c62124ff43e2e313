"""The job's stages as decisions: INIT -> READY (placement, then the checks with their setup
retries), READY -> RUNNING, a rebuilt PrimeMaster's self-recovery (tier 6), and the stop."""

from __future__ import annotations

from dlu_api.status import JobStage
from dlu_api.vocabulary import ActorStage, EventKind
from dlu_prime.master.change_types import (
    ActorsClosed,
    ActorsPlaced,
    ActorsStaged,
    MasterRestarted,
    Note,
)
from dlu_prime.master.core import memory_chain
from dlu_prime.master.core.commands import (
    AdoptResized,
    Cleanup,
    Command,
    PlaceActors,
    Purpose,
    RunChecks,
    SetMemory,
    StartActors,
    StopActors,
)
from dlu_prime.master.core.decision import Decision, stage_change, stop_commands, stopping
from dlu_prime.master.core.events import Done, StopRequested
from dlu_prime.master.core.setup_retry import retry_setup
from dlu_prime.master.elastic_policy import unplaced_elastic
from dlu_prime.master.lifecycle import EXIT_FAILED, EXIT_STOPPED, RestartLimitError, start_targets, unstarted
from dlu_prime.master.relaunch import overrides
from dlu_prime.master.resize import extra_ranks
from dlu_prime.master.state import JobState, role_size
from dlu_prime.master.tiers import Budget, over_limit
from dlu_prime.scheduler.base import ActorSetupError, SchedulingError


def prepare(state: JobState) -> Decision:
    """INIT: place the actors; a resumed run first tells the scheduler the memory its actors'
    earlier relaunches gave them (`lifecycle.kept_memory`), so they start with it."""
    memory = overrides(state)
    return Decision((), (*((SetMemory(memory),) if memory else ()), PlaceActors()))


def placed(state: JobState, done: Done) -> Decision:
    """The actors are placed (or placement failed): record them, then their checks."""
    if done.error is not None:
        return _prepare_failed(state, done.error)
    nodes: dict[str, str | None] = dict(done.value or {})
    note = Note(EventKind.ACTORS_CREATED, f"{len(nodes)} actor(s) placed")
    changes = (ActorsPlaced(nodes, note=note), *unplaced_elastic(state, nodes))
    kept = tuple(n for n in state.actors if n in nodes)  # an elastic node's unplaced ones leave
    return Decision(changes, (RunChecks(kept, Purpose.PREPARE, wait_s=_rebuild_wait(state)),))


def _rebuild_wait(state: JobState) -> float:
    """How long the executor waits for Ray to rebuild an actor that died under the checks."""
    return state.spec.health.heartbeat_timeout_s


def checked(state: JobState, done: Done, command: RunChecks) -> Decision:
    """INIT's checks ended: READY, or the stop they call for."""
    retry = retry_setup(state, done, command)
    if retry is not None and retry.error is None:
        return retry
    error = retry.error if retry is not None else done.error
    if error is not None:
        return _prepare_failed(state, error)
    every = list(state.actors)
    ready = stage_change(state, JobStage.READY, "every actor passed its self check")
    return Decision((ActorsStaged(every, ActorStage.READY), ready))


def _prepare_failed(state: JobState, error: BaseException) -> Decision:
    if isinstance(error, SchedulingError):
        return stopping(state, EXIT_FAILED, f"cannot schedule the job: {error}")
    if isinstance(error, RestartLimitError):
        return stopping(state, EXIT_FAILED, str(error))
    if isinstance(error, ActorSetupError):
        failed = ActorsStaged([error.actor], ActorStage.FAILED, error.error)
        stop = StopRequested(EXIT_FAILED, f"{error.actor} failed its self check: {error.error}")
        return Decision((failed,), follow=stop)  # the stop sees it FAILED: not stopped again
    return Decision(error=error)  # a bug: the loop stops the job with it ("PrimeMaster error")


def start(state: JobState, stop: str | None) -> Decision:
    """READY -> RUNNING, saved first, then every actor is started (start is idempotent)."""
    if stop is not None:
        return stopping(state, EXIT_STOPPED, stop)
    running = stage_change(state, JobStage.RUNNING, "job started")
    return Decision((running,), (StartActors(tuple(start_targets(state)), Purpose.START),))


def master_rebuilt(state: JobState) -> Decision:
    """Tier 6, on a reconstructed PrimeMaster's loaded state: counted, then RUNNING carries on
    (actors saved READY but never started are started; an in-flight failover or resize is
    finished by the loop); past `master_max_restart` or in a short-lived stage it stops."""
    over = over_limit(state, Budget.MASTER)  # this restart, counted now, passes the limit
    counted = Decision((MasterRestarted(),))
    limit = state.spec.limits.master_max_restart
    if over and state.stage is not JobStage.STOPPED:
        restarts = f"{state.master_restart_count + 1} PrimeMaster restarts"
        return counted.then(stopping(state, EXIT_FAILED, f"master_max_restart={limit} reached ({restarts})"))
    if state.stage is JobStage.RUNNING:
        ranks = {role: (tuple(r), role_size(state, role)) for role, r in extra_ranks(state).items()}
        commands: list[Command] = [AdoptResized(ranks)] if ranks else []
        commands.extend(memory_chain.rebuilt(state))  # the actors' memory, a relaunch in flight
        waiting = unstarted(state)
        if waiting:
            commands.append(StartActors(tuple(waiting), Purpose.SELF_RECOVER))
        return counted.then(Decision((), tuple(commands)))
    if state.stage is not JobStage.STOPPED:
        why = f"PrimeMaster restarted during {state.stage.value}, a short-lived stage; stopped safely"
        return counted.then(stopping(state, EXIT_FAILED, why))
    return counted


def self_recover_failed(state: JobState, done: Done) -> Decision:
    if done.error is None:
        return Decision()
    return stopping(state, EXIT_FAILED, f"PrimeMaster self-recovery failed: {done.error_text}")


def stop_step(state: JobState, done: Done) -> Decision:
    """Stop, clean up, then STOPPED even if a step failed: a job left in STOPPING would keep its
    driver waiting forever. A failed step is recorded on the timeline."""
    changes: list[object] = []
    if done.error is not None:
        kind = EventKind.STOP_FAILED if isinstance(done.command, StopActors) else EventKind.CLEANUP_FAILED
        changes.append(Note(kind, done.error_text))
    if isinstance(done.command, Cleanup) and state.stage is JobStage.STOPPING:
        changes += [ActorsClosed(), stage_change(state, JobStage.STOPPED)]
    return Decision(tuple(changes))  # pyright: ignore[reportArgumentType]


def finish_stopping(state: JobState) -> Decision:
    """A stop a previous PrimeMaster began: its remaining steps."""
    return Decision((), stop_commands(state))
