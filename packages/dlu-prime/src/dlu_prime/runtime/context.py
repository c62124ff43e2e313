"""`current_worker()`: who this process is inside a DLU job. Set once by the worker actor."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from dlu_api.status import JobEvent


@dataclass
class Health:
    """What the worker reports about itself; read by the PrimeMaster when it polls.

    Only what reports beats is judged by them: `watched` turns on with the first beat from the
    worker's own code (a user `heartbeat()`, a SubMaster's serving loop) and off with `pause()`
    (a phase that sends none, e.g. a rank waiting in a rendezvous). A worker that never beats is
    judged by its poll answers alone, so a healthy job never looks stale however long it runs.
    `beats` counts them: the PrimeMaster judges staleness by when it saw the count move on its
    own clock, never by comparing another node's timestamps with its own.
    """

    last_heartbeat: float = field(default_factory=time.time)
    step: int = 0
    metric: float | None = None
    beats: int = 0
    watched: bool = False
    steps_reported: bool = False
    errors: list[JobEvent] = field(default_factory=list[JobEvent])
    lock: threading.Lock = field(default_factory=threading.Lock)
    on_report: Callable[[], None] | None = None  # pushes a report at once instead of at the next poll
    step_offset: int = 0  # what `dlu debug set-step` added to the steps the worker's own beats carry

    def beat(self, step: int | None, metric: float | None) -> None:
        """A beat from the worker's own loop: from now on it is judged by its beats."""
        self.relay(step, metric)
        with self.lock:
            self.watched = True
            if step is not None:
                self.steps_reported = True

    def relay(self, step: int | None, metric: float | None) -> None:
        """Progress shown in the status (step, metric) without being judged by the PrimeMaster:
        an elastic rank's agent relays its process' beats and watches that process itself."""
        with self.lock:
            self.last_heartbeat = time.time()
            self.beats += 1
            if step is not None:
                self.step = step + self.step_offset
            if metric is not None:
                self.metric = metric

    def set_step(self, step: int) -> None:
        """`dlu debug set-step`: the reported step becomes `step` and goes on from there, the
        worker's own beats shifted by the difference (a beat does not undo it), until `pause()`
        (a restart or rendezvous: the worker's own count is its truth again)."""
        with self.lock:
            self.step_offset = step - (self.step - self.step_offset)
            self.step = step

    def pause(self) -> None:
        """No beats are due until the next one (a restart, a rendezvous): stop judging them."""
        with self.lock:
            if self.step_offset:
                self.step -= self.step_offset
                self.step_offset = 0
            self.watched = False
            self.steps_reported = False
            self.last_heartbeat = time.time()

    def report(self, message: str) -> None:
        with self.lock:
            self.errors.append(JobEvent(time=time.time(), kind="error_report", message=message))
        if self.on_report is not None:
            self.on_report()

    def snapshot(self) -> dict[str, Any]:
        with self.lock:
            return {
                "last_heartbeat": self.last_heartbeat,
                "step": self.step,
                "metric": self.metric,
                "beats": self.beats,
                "watched": self.watched,
                "steps_reported": self.steps_reported,
                "errors": [e.model_dump() for e in self.errors],
            }


@dataclass(frozen=True)
class WorkerContext:
    """Identity and config of the worker this code runs in."""

    job: str
    role: str
    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    node_rank: int
    actor_name: str
    config: dict[str, Any]
    health: Health = field(default_factory=Health, compare=False, repr=False)
    role_sizes: dict[str, int] = field(default_factory=dict[str, int])

    @property
    def device(self) -> str:
        """The torch device this worker should use ("cuda:0", "cuda:3", "cpu"), per the GPU table."""
        return os.environ.get("DLU_DEVICE", "cpu")

    @property
    def devices(self) -> list[str]:
        """Every torch device of this worker (several when it holds several GPUs)."""
        return [d for d in os.environ.get("DLU_DEVICES", self.device).split(",") if d]


_current: WorkerContext | None = None


def set_current_worker(context: WorkerContext | None) -> None:
    global _current
    _current = context


def current_worker() -> WorkerContext:
    """The worker this code runs in.

    Raises:
        RuntimeError: called outside a DLU worker.
    """
    if _current is None:
        raise RuntimeError("current_worker() is only available inside a DLU worker actor")
    return _current


def heartbeat(step: int | None = None, metric: float | None = None) -> None:
    """Tell the PrimeMaster this worker is alive and, optionally, at which training step."""
    if _current is not None:
        _current.health.beat(step, metric)


def report_error(message: str) -> None:
    """Report a failure the worker noticed itself; the PrimeMaster is woken to act on it."""
    if _current is not None:
        _current.health.report(message)
