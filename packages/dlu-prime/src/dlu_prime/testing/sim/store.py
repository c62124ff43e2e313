"""A simulated state store: the in-memory reference store plus the ways a real one misbehaves.

- `delay_s`: every operation takes this long (the clock moves).
- `hang(until)`: a SIGSTOPped server. Every operation times out (unavailable, after the writer's
  retry budget); a put sent meanwhile is either lost, applied at once with its reply lost, or
  executed when the server resumes ("late"), before anything sent after it.
- `kill(until)`: a dead server: every operation fails, nothing sent meanwhile is applied.

Outages end on the clock, checked at each operation (`resume_due`). Puts also tick the crash
point, so the PrimeMaster can die with a put applied or not.
"""

from __future__ import annotations

import contextlib
import random
from dataclasses import dataclass

from dlu_prime.state.base import StateStoreUnavailableError, Versioned
from dlu_prime.state.memory import MemoryStateStore
from dlu_prime.testing.sim.clock import SimClock
from dlu_prime.testing.sim.crash import CrashPoint, MasterKilled

TIMEOUT_S = 2.0
"""Simulated time a timed-out operation takes (a real store's retry budget, scaled down so
heartbeats stay fresh)."""


@dataclass(frozen=True)
class LateWrite:
    job: str
    data: bytes
    token: int | None


class SimStore(MemoryStateStore):
    name = "sim"

    def __init__(self, clock: SimClock, rng: random.Random, crash: CrashPoint) -> None:
        super().__init__()
        self.clock = clock
        self.rng = rng
        self.crash = crash
        self.delay_s = 0.0
        self.down_until: float | None = None
        self.hung = False  # a hang (late writes possible) rather than a kill
        self.late: list[LateWrite] = []
        self.applied_late = 0
        self.lost_replies = 0
        self.puts = 0

    # faults ------------------------------------------------------------------------------------
    def hang(self, until: float) -> None:
        self.down_until, self.hung = until, True

    def kill(self, until: float) -> None:
        self.down_until, self.hung = until, False

    @property
    def down(self) -> bool:
        self.resume_due()
        return self.down_until is not None

    def resume_due(self) -> None:
        """The outage is over: a hung server executes what was sent to it, in order."""
        if self.down_until is None or self.clock() < self.down_until:
            return
        self.down_until = None
        late, self.late = self.late, []
        for write in late:
            try:
                super().put(write.job, write.data, write.token)
                self.applied_late += 1
            except Exception:  # a late write that lost its compare-and-set changes nothing
                pass

    def _unavailable(self, operation: str) -> StateStoreUnavailableError:
        self.clock.advance(TIMEOUT_S)
        return StateStoreUnavailableError(self.name, operation, "timed out (simulated outage)")

    # the StateStore contract -------------------------------------------------------------------
    def get(self, job: str) -> Versioned | None:
        if self.down:
            raise self._unavailable("get")
        self.clock.advance(self.delay_s)
        return super().get(job)

    def peek(self, job: str) -> Versioned | None:
        """What the store holds, outage or not (for the invariants, never for the manager)."""
        return super().get(job)

    def plant(self, job: str, data: bytes) -> None:
        """Write a document as another program would (no fault, no crash point)."""
        super().put(job, data, None)

    def put(self, job: str, data: bytes, token: int | None) -> int:
        self.puts += 1
        if self.crash.tick("store put"):
            if self.crash.apply_put and not self.down:
                with contextlib.suppress(Exception):  # lost its compare-and-set: nothing applied
                    super().put(job, data, token)
            raise MasterKilled("store put")
        if self.down:
            if self.hung:
                fate = self.rng.random()
                if fate < 0.4:
                    self.late.append(LateWrite(job, data, token))
                elif fate < 0.6:
                    super().put(job, data, token)
                    self.lost_replies += 1
            raise self._unavailable("put")
        self.clock.advance(self.delay_s)
        if self.rng.random() < 0.01:  # a reply lost on a healthy store
            super().put(job, data, token)
            self.lost_replies += 1
            raise self._unavailable("put")
        return super().put(job, data, token)
