"""The simulation's clock: time moves only when the simulation moves it."""

from __future__ import annotations


class SimClock:
    """Seconds since the simulated epoch; `advance` is the only way time passes."""

    def __init__(self, now: float = 1_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> float:
        self.now += seconds
        return self.now

    def sleep(self, seconds: float) -> None:
        """A wait of the code under test (the executor's for a rebuilt actor) passes simulated time."""
        self.advance(seconds)
