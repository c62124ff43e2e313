"""Setup retries: an actor that died under the checks before a run (or a job restart) and that
Ray rebuilt is checked again, once per death, on its role's budget."""

from __future__ import annotations

from dataclasses import replace

from dlu_prime.master.change_types import SetupRetried
from dlu_prime.master.core.commands import RunChecks
from dlu_prime.master.core.decision import Decision
from dlu_prime.master.core.events import Done
from dlu_prime.master.failover import setup_retry
from dlu_prime.master.lifecycle import RestartLimitError
from dlu_prime.master.state import JobState
from dlu_prime.scheduler.base import ActorSetupError


def retry_setup(state: JobState, done: Done, command: RunChecks) -> Decision | None:
    """An actor that died under the checks and that Ray rebuilt is checked again, once per
    death, on its role's budget; which process answers (`done.value`) tells one death from the
    next. None: the failure is not one to retry."""
    exc = done.error
    if not isinstance(exc, ActorSetupError) or not exc.transient or exc.actor not in state.actors:
        return None
    incarnation: str | None = done.value
    again = replace(command, names=(exc.actor,))
    if exc.actor in command.counted and incarnation is not None and command.counted[exc.actor] == incarnation:
        # The same process answers: the call failed while Ray was still rebuilding it (or on a
        # blip), not because it died again. Not another fault.
        return Decision((), (again,))
    recovery, stop = setup_retry(state, exc.actor, exc.error)
    if recovery is None:
        return Decision(error=RestartLimitError(stop or exc.error))
    counted = {**command.counted, exc.actor: incarnation}
    return Decision((SetupRetried(recovery),), (replace(again, counted=counted),))
