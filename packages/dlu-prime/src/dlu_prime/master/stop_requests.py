"""Stops asked for on other threads (a user's `dlu stop`, a limit reached while a SubMaster or
a rank reported): kept here until the job's loop takes them at its next step. The first reason
of each kind wins; a failed stop comes before a user's."""

from __future__ import annotations

import threading
from collections.abc import Callable

from dlu_prime.master.core.events import StopRequested
from dlu_prime.master.lifecycle import EXIT_FAILED, EXIT_STOPPED


class StopRequests:
    def __init__(self, lock: threading.RLock, wake: Callable[[], None]) -> None:
        self._lock = lock
        self._wake = wake  # the loop looks now instead of at its next tick
        self.user: str | None = None  # a user's stop (EXIT_STOPPED)
        self.failed: str | None = None  # a limit reached outside the monitoring thread (EXIT_FAILED)

    def request(self, reason: str) -> None:
        with self._lock:
            if self.user is None:
                self.user = reason
        self._wake()

    def request_failed(self, reason: str) -> None:
        with self._lock:
            if self.failed is None:
                self.failed = reason
        self._wake()

    def ask(self, reason: str, failed: bool) -> None:
        """The executor's `AskStop`."""
        if failed:
            self.request_failed(reason)
        else:
            self.request(reason)

    def pending(self) -> StopRequested | None:
        """The stop the loop takes now, if any was asked for."""
        if self.failed is not None:
            return StopRequested(EXIT_FAILED, self.failed)
        if self.user is not None:
            return StopRequested(EXIT_STOPPED, self.user)
        return None
