"""What the PrimeManager remembers of its actors' liveness between monitoring passes: when each
one's beats and training steps last moved, and since when Ray has been rebuilding it, all on
the PrimeMaster's own clock (remote timestamps drift over a week)."""

from __future__ import annotations

from collections.abc import Mapping

from dlu_api.vocabulary import ActorStage
from dlu_prime.scheduler.base import ActorObservation


class Liveness:
    def __init__(self) -> None:
        self.steps: dict[str, tuple[int, float]] = {}
        self.beats: dict[str, tuple[int, float]] = {}
        self.unavailable: dict[str, float] = {}
        self.final_steps: dict[str, int] = {}
        self.metrics: dict[str, float] = {}  # last metric each actor reported (shown, never judged)

    def track(self, observations: Mapping[str, ActorObservation], now: float) -> None:
        """One walk over the pass's observations, changing the memory in place: the same result
        as `track_steps`, `track_beats` and `track_unavailable` (the rules; a test holds them
        equal), without three walks and a copy of every actor's entry each pass."""
        running, finish = ActorStage.RUNNING, ActorStage.FINISH
        steps, final, metrics = self.steps, self.final_steps, self.metrics
        beats = self.beats
        kept = 0  # beats kept this pass: any more in `beats` belong to actors not polled now
        unavailable = {n: t for n, t in self.unavailable.items() if n in observations}
        for name, seen in observations.items():
            if seen.metric is not None:
                metrics[name] = seen.metric
            stage = seen.stage
            if stage is running:
                final.pop(name, None)
                if seen.watched:
                    kept += 1
                    last_beat = beats.get(name)
                    if last_beat is None or last_beat[0] != seen.beats:
                        beats[name] = (seen.beats, now)
                    if not seen.steps_reported:
                        steps.pop(name, None)
                        last = None
                    else:
                        last = steps.get(name)
                        if last is None or last[0] != seen.step:
                            steps[name] = (seen.step, now)
                else:
                    beats.pop(name, None)
                    last = steps.get(name)
                    if last is None or last[0] != seen.step:
                        steps[name] = (seen.step, now)
            else:
                beats.pop(name, None)
                if stage is finish:
                    # Hang tracking drops a finished actor; its status still shows how far it got.
                    last_step = steps.get(name, (0, now))[0]
                    final[name] = max(seen.step, last_step, final.get(name, 0))
                steps.pop(name, None)
            if seen.unavailable:
                unavailable.setdefault(name, now)
            elif unavailable:
                unavailable.pop(name, None)
        if len(beats) > kept:  # actors no longer polled (removed, or being resized)
            self.beats = {name: beat for name, beat in beats.items() if name in observations}
        self.unavailable = unavailable

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
