"""The retry rhythm of the agent's background copies (the persister's disk writes, the
replicator's copies to the buddy): after a failure the next try waits a pause that doubles up
to a cap, and a run of failures is reported once, when it starts and when it ends."""

from __future__ import annotations

import time
from collections.abc import Callable


class Backoff:
    def __init__(self, first_s: float, max_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.first_s = first_s
        self.max_s = max_s
        self.clock = clock
        self.failures = 0  # failed tries in all
        self.failing = False  # the last try failed
        self._pause = first_s
        self._retry_at = 0.0

    def ready(self) -> bool:
        """Whether a try may run now (the pause after the last failure is over)."""
        return self.clock() >= self._retry_at

    def retry_now(self) -> None:
        """The next try runs at once (a last try before the agent stops)."""
        self._retry_at = 0.0

    def failed(self) -> bool:
        """A try failed: the next waits; True when this failure starts a run (report it)."""
        self.failures += 1
        self._retry_at = self.clock() + self._pause
        self._pause = min(self._pause * 2, self.max_s)
        started, self.failing = not self.failing, True
        return started

    def succeeded(self) -> bool:
        """A try succeeded: the pause starts over; True when it ends a run of failures."""
        self._pause = self.first_s
        ended, self.failing = self.failing, False
        return ended
