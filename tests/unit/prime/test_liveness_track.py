"""`Liveness.track` walks a pass once, in place; the rules are `track_steps`, `track_beats` and
`track_unavailable` (pure): over random passes the two give the same memory."""

from __future__ import annotations

import random

from dlu_api.vocabulary import ActorStage
from dlu_prime.master.liveness import Liveness
from dlu_prime.master.monitor import track_beats, track_steps, track_unavailable
from dlu_prime.scheduler.base import ActorObservation

STAGES = [ActorStage.RUNNING, ActorStage.RUNNING, ActorStage.FINISH, ActorStage.INIT, ActorStage.FAILED, None]


def _pass(rng: random.Random, names: list[str]) -> dict[str, ActorObservation]:
    seen = {}
    for name in rng.sample(names, rng.randint(0, len(names))):
        seen[name] = ActorObservation(
            stage=rng.choice(STAGES),
            step=rng.randint(0, 3),
            beats=rng.randint(0, 3),
            watched=rng.random() < 0.5,
            steps_reported=rng.random() < 0.5,
            unavailable=rng.random() < 0.2,
            metric=rng.choice([None, 0.5]),
        )
    return seen


def test_one_walk_in_place_keeps_the_rules_of_the_pure_trackers() -> None:
    rng = random.Random(7)
    names = [f"a{i}" for i in range(12)]
    for _ in range(200):
        live = Liveness()
        steps: dict[str, tuple[int, float]] = {}
        beats: dict[str, tuple[int, float]] = {}
        unavailable: dict[str, float] = {}
        for t in range(15):
            seen = _pass(rng, names)
            live.track(seen, float(t))
            steps = track_steps(steps, seen, float(t))
            beats = track_beats(beats, seen, float(t))
            unavailable = track_unavailable(unavailable, seen, float(t))
            assert (live.steps, live.beats, live.unavailable) == (steps, beats, unavailable)
