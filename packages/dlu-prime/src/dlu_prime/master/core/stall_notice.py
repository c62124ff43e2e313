"""The stall notice as a decision: after a quiet pass, whether nothing has moved for
`health.stall_timeout_s` (`stall.judge`), and what waits on what. A notice, never a failure:
it records a "stalled" event once per stall and "progress_resumed" when anything moves."""

from __future__ import annotations

from dlu_api.status import JobStage
from dlu_prime.master import stall
from dlu_prime.master.change_types import Note
from dlu_prime.master.core.decision import Decision
from dlu_prime.master.core.events import StallObserved
from dlu_prime.master.state import JobState


def stall_observed(state: JobState, event: StallObserved, now: float) -> Decision:
    """The reply is the new (memory, announced) pair the observer keeps for the next pass."""
    timeout = state.spec.health.stall_timeout_s
    if timeout is None or state.stage is not JobStage.RUNNING:
        return Decision(reply=(stall.StallMemory(), False))
    busy = state.failover is not None or state.resize is not None
    marks = stall.progress_marks(state, event.channels)
    moved_at = stall.latest_move(state, event.steps, event.beats)
    memory, verdict = stall.judge(event.memory, marks, moved_at, now, timeout, busy)
    if verdict is True:
        # Nothing to name (only roles that never report steps): no notice, and none of its
        # end. A change of marks (a reader arriving at a channel, a stage) judges it again.
        found = stall.waits(state, event.observations, event.channels)
        if not found:
            return Decision(reply=(memory, False))
        message = stall.describe(found, now - memory.since, timeout)
        return Decision((Note(stall.STALLED, message),), reply=(memory, True), log=(message,))
    if verdict is False:
        resumed = (Note(stall.RESUMED, "progress resumed"),) if event.announced else ()
        return Decision(resumed, reply=(memory, False))
    return Decision(reply=(memory, event.announced))
