"""What the PrimeManager remembers of its actors' liveness between monitoring passes: when each
one's beats and training steps last moved, and since when Ray has been rebuilding it, all on
the PrimeMaster's own clock (remote timestamps drift over a week)."""

from __future__ import annotations

from collections.abc import Mapping

from dlu_api.vocabulary import ActorStage
from dlu_prime.master.monitor import track_beats, track_steps, track_unavailable
from dlu_prime.scheduler.base import ActorObservation


class Liveness:
    def __init__(self) -> None:
        self.steps: dict[str, tuple[int, float]] = {}
        self.beats: dict[str, tuple[int, float]] = {}
        self.unavailable: dict[str, float] = {}
        self.final_steps: dict[str, int] = {}
        self.metrics: dict[str, float] = {}  # last metric each actor reported (shown, never judged)

    def track(self, observations: Mapping[str, ActorObservation], now: float) -> None:
        for name, seen in observations.items():
            if seen.metric is not None:
                self.metrics[name] = seen.metric
            if seen.stage is ActorStage.FINISH:
                # Hang tracking drops a finished actor; its status still shows how far it got.
                last = self.steps.get(name, (0, now))[0]
                self.final_steps[name] = max(seen.step, last, self.final_steps.get(name, 0))
            elif seen.stage is ActorStage.RUNNING:
                self.final_steps.pop(name, None)
        self.steps = track_steps(self.steps, observations, now)
        self.beats = track_beats(self.beats, observations, now)
        self.unavailable = track_unavailable(self.unavailable, observations, now)

    def forget(self) -> None:
        """A job-level restart: what the old actors showed says nothing of the new ones."""
        self.steps.clear()
        self.beats.clear()
        self.final_steps.clear()
        self.metrics.clear()

    def last_steps(self) -> dict[str, int]:
        """The last step of each running actor, and the final one of each finished actor."""
        return self.final_steps | {name: step for name, (step, _) in self.steps.items()}

    def last_metrics(self) -> dict[str, float]:
        """The last metric each actor reported, kept once it finished (its final loss, say)."""
        return dict(self.metrics)
