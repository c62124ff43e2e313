"""The agent's background writer: every k-th committed step of its rank, to durable storage.

It runs in the agent (a thread of the ElasticWorker actor), never in the training process: a
save returns after its memory copy, and a slow or failing disk only delays the durable copy.
Each tick it looks at its rank's two slots; the newest complete step that is a multiple of k
and newer than the last one written is copied out of shared memory (a consistent snapshot,
see slot.py) and written. A write that fails (disk full, folder gone) is logged, reported once
per run of failures through `on_event`, and retried with a growing pause: never a crash.
Files of older steps of this rank are removed once a newer step is on disk for every rank.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

from dlu_elastic.checkpoint import disk
from dlu_elastic.checkpoint.backoff import Backoff
from dlu_elastic.checkpoint.slot import headers, slot_path, snapshot
from dlu_elastic.checkpoint.ticking import Ticking

logger = logging.getLogger(__name__)

TICK_S = 0.2
RETRY_FIRST_S = 0.5
RETRY_MAX_S = 30.0

EventSink = Callable[[str, str], None]


class Persister(Ticking):
    def __init__(
        self, folder: Path, base: Path, every: int, on_event: EventSink, tick_s: float = TICK_S
    ) -> None:
        super().__init__("dlu-ckpt-persist", tick_s)
        self.folder = folder
        self.base = base
        self.every = every
        self.on_event = on_event
        self.last_written = 0
        self.backoff = Backoff(RETRY_FIRST_S, RETRY_MAX_S)

    def start(self) -> Persister:
        super().start()
        return self

    def stop(self, timeout: float = 5.0) -> None:
        """Stop after one last look (the final due step is written if the disk takes it)."""
        self.end_thread(timeout)
        self.backoff.retry_now()
        try:
            self.tick()
        except Exception:
            logger.exception("checkpoint persister's last write failed")

    @property
    def failures(self) -> int:
        """Failed writes in all (each also retried)."""
        return self.backoff.failures

    def on_error(self, exc: Exception) -> None:  # never let a surprise end the durable copies
        logger.exception("checkpoint persister tick failed", exc_info=exc)

    def due(self) -> int | None:
        """The slot holding the step to write now, if any."""
        best: tuple[int, int] | None = None
        for index, header in enumerate(headers(self.folder)):
            if header is None or not header.complete or header.step <= self.last_written:
                continue
            if header.step % self.every == 0 and (best is None or header.step > best[0]):
                best = (header.step, index)
        return best[1] if best is not None else None

    def tick(self) -> None:
        if not self.backoff.ready():
            return
        slot = self.due()
        if slot is None:
            return
        snap = snapshot(slot_path(self.folder, slot))
        if snap is None:
            return  # overwritten meanwhile: the next tick looks again
        step = snap.header.step
        try:
            written = disk.write(self.base, snap)
        except OSError as exc:
            logger.warning("could not persist checkpoint step %d to %s (retrying): %s", step, self.base, exc)
            if self.backoff.failed():
                self.on_event(
                    "checkpoint_persist_failed",
                    f"rank {snap.header.rank}: writing step {step} to {self.base} failed ({exc}); retrying",
                )
            return
        self.last_written = step
        if self.backoff.succeeded():
            self.on_event(
                "checkpoint_persisted", f"rank {snap.header.rank}: step {step} written again ({written})"
            )
        done = [s for s, world in disk.complete_steps(self.base).items() if world == snap.header.world]
        if done:
            disk.prune(self.base, snap.header.rank, keep_from=max(done))
