"""What `decide` returns: the changes to save, the commands to run next, and for a caller on
another thread its answer (or the error it gets). `follow` is an event decided at once, after
the changes are applied, when a decision needs the state they leave (no I/O in between)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from dlu_api.status import JobStage
from dlu_api.vocabulary import ActorStage
from dlu_prime.master.change_types import StageChanged
from dlu_prime.master.changes import Change
from dlu_prime.master.core.commands import Cleanup, Command, StopActors
from dlu_prime.master.core.events import Event
from dlu_prime.master.lifecycle import ALLOWED, IllegalTransition
from dlu_prime.master.state import JobState


@dataclass(frozen=True)
class Decision:
    changes: tuple[Change, ...] = ()
    commands: tuple[Command, ...] = ()
    reply: Any = None
    error: BaseException | None = None  # raised to the caller once the changes are saved
    follow: Event | None = None
    log: tuple[str, ...] = ()  # what the loop logs (info) about it

    def then(self, other: Decision) -> Decision:
        """This decision followed by `other` (made on the same state: `other` must not depend
        on this one's changes; use `follow` when it does)."""
        return Decision(
            self.changes + other.changes,
            self.commands + other.commands,
            other.reply if other.reply is not None else self.reply,
            self.error or other.error,
            other.follow or self.follow,
            self.log + other.log,
        )


def stage_change(
    state: JobState, stage: JobStage, reason: str = "", exit_code: int | None = None
) -> StageChanged:
    """The job moves to `stage`; a move the stage machine forbids is a bug of the core.

    Raises:
        IllegalTransition: `stage` is not reachable from the current stage.
    """
    if stage not in ALLOWED[state.stage]:
        raise IllegalTransition(f"{state.stage.value} -> {stage.value}")
    return StageChanged(stage, reason, exit_code)


def stopping(state: JobState, exit_code: int, reason: str) -> Decision:
    """Any stage -> STOPPING, then stop and remove every actor (STOPPED when the cleanup ends)."""
    if state.stage in (JobStage.STOPPING, JobStage.STOPPED):
        return Decision()
    change = stage_change(state, JobStage.STOPPING, reason, exit_code)
    return Decision((change,), stop_commands(state))


def stop_commands(state: JobState) -> tuple[Command, ...]:
    """The running actors and the finished ones are asked to stop before the clean-up kills
    them: an elastic agent that finished still holds its rank's checkpoint slots in shared
    memory, and only a stopped agent removes them at once (a killed one's wait for an adopter
    first). A failed actor is not asked again: it is dead or its code has failed."""
    held = tuple(
        n for n, a in state.actors.items() if not a.stage.is_terminal or a.stage is ActorStage.FINISH
    )
    return (StopActors(held), Cleanup())
