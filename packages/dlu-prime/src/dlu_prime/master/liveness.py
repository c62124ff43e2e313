"""What the PrimeManager remembers of its actors' liveness between monitoring passes: when each
one's beats and training steps last moved, and since when Ray has been rebuilding it, all on
the PrimeMaster's own clock (remote timestamps drift over a week)."""

from __future__ import annotations

from collections.abc import Mapping

from dlu_prime.master.monitor import track_beats, track_steps, track_unavailable
from dlu_prime.scheduler.base import ActorObservation


class Liveness:
    def __init__(self) -> None:
        self.steps: dict[str, tuple[int, float]] = {}
        self.beats: dict[str, tuple[int, float]] = {}
        self.unavailable: dict[str, float] = {}

    def track(self, observations: Mapping[str, ActorObservation], now: float) -> None:
        self.steps = track_steps(self.steps, observations, now)
        self.beats = track_beats(self.beats, observations, now)
        self.unavailable = track_unavailable(self.unavailable, observations, now)

    def forget(self) -> None:
        """A job-level restart: what the old actors showed says nothing of the new ones."""
        self.steps.clear()
        self.beats.clear()

    def last_steps(self) -> dict[str, int]:
        return {name: step for name, (step, _) in self.steps.items()}
