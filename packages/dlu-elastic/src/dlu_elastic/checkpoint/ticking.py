"""The agent's background threads (the persister, the replicator): `tick()` every `tick_s`
until stopped; a surprise in a tick goes to `on_error` and never ends the thread."""

from __future__ import annotations

import threading
from abc import ABC, abstractmethod


class Ticking(ABC):
    def __init__(self, name: str, tick_s: float) -> None:
        self.tick_s = tick_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    @abstractmethod
    def tick(self) -> None:
        """One round of the thread's work."""

    @abstractmethod
    def on_error(self, exc: Exception) -> None:
        """A tick raised: record it (an event, a retry); the thread goes on."""

    def start(self) -> Ticking:
        self._thread.start()
        return self

    def end_thread(self, timeout: float) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout)

    def _run(self) -> None:
        while not self._stop.wait(self.tick_s):
            try:
                self.tick()
            except Exception as exc:
                self.on_error(exc)
