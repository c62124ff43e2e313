"""The PrimeManager's loop between the decision core and the executor: an event is decided and
its changes applied (saved) under the lock, its commands run outside it, and each command's
outcome is decided before the next command runs, to the end of the chain."""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from dlu_api.status import JobStage
from dlu_prime.master.changes import StageChanged
from dlu_prime.master.core import Decision, decide
from dlu_prime.master.core.commands import Command, Purpose, RunChecks
from dlu_prime.master.core.events import Done, Event, StopRequested
from dlu_prime.master.lifecycle import EXIT_STOPPED
from dlu_prime.master.ports import StatePort

logger = logging.getLogger(__name__)

# Chains a stop cancels: what they still had queued is not run once the job is stopping.
_CANCELLED_BY_STOP = frozenset({Purpose.PREPARE, Purpose.START, Purpose.FAILOVER, Purpose.SELF_RECOVER})


class DecisionLoop:
    def __init__(
        self,
        port: StatePort,
        execute: Callable[[Command], Done],
        clock: Callable[[], float],
        stop_request: Callable[[], str | None],
        retain: Callable[[], None],
    ) -> None:
        self._port = port
        self._execute = execute
        self._clock = clock
        self._stop_request = stop_request  # a user's stop asked for on another thread
        self._retain = retain  # the store keeps a STOPPED job's document as it ends

    def handle(self, event: Event) -> Any:
        """Decide `event` and everything that follows from it. Returns the decision's answer
        for a caller on another thread (an in-place verdict), or raises its error."""
        work: deque[Event | Command] = deque([event])
        reply: Any = None
        while work:
            item = work.popleft()
            if isinstance(item, Event):
                decision = self._decide(item)
                if decision.reply is not None:
                    reply = decision.reply
                if decision.error is not None:
                    raise decision.error
                work.extendleft(reversed(decision.commands))
                continue
            command = self._pre_empted(item)
            if isinstance(command, StopRequested):
                work.appendleft(command)
            elif command is not None:
                work.appendleft(self._execute(command))
        return reply

    def _decide(self, event: Event) -> Decision:
        """One decision and the ones that follow at once from the state it leaves, applied."""
        port = self._port
        with port.lock, port.atomic():  # the decision and its follows: saved in one write
            decision = decide(port.state(), event, self._clock())
            if decision.changes:
                port.apply(*decision.changes)
            while decision.follow is not None:
                more = decide(port.state(), decision.follow, self._clock())
                if more.changes:
                    port.apply(*more.changes)
                decision = replace(decision.then(more), follow=more.follow)
        for line in decision.log:
            logger.info("job %s: %s", port.state().job, line)
        if any(isinstance(c, StageChanged) and c.stage is JobStage.STOPPED for c in decision.changes):
            self._retain()
        return decision

    def _pre_empted(self, command: Command) -> Command | StopRequested | None:
        """The command to run: a stop asked for after placement comes before the checks; what a
        stopped chain still had queued is not run."""
        purpose = getattr(command, "purpose", None)
        stop = self._stop_request()
        if isinstance(command, RunChecks) and purpose is Purpose.PREPARE and stop is not None:
            return StopRequested(EXIT_STOPPED, stop)
        if purpose in _CANCELLED_BY_STOP and self._port.state().stage in (
            JobStage.STOPPING,
            JobStage.STOPPED,
        ):
            return None
        return command
