"""`dlu debug set-step` on a worker whose own loop beats: the step set stays, and goes on from
there with the loop's beats, until the worker restarts (pause)."""

from __future__ import annotations

from dlu_prime.runtime.context import Health


def test_the_next_beat_does_not_undo_a_set_step() -> None:
    health = Health()
    health.beat(5, None)
    health.set_step(100)
    assert health.step == 100
    health.beat(6, None)
    assert health.step == 101
    health.set_step(40)  # set again: from the worker's own 6
    health.beat(7, None)
    assert health.step == 41


def test_a_set_step_before_any_beat_counts_from_zero() -> None:
    health = Health()
    health.set_step(10)
    health.beat(1, None)
    assert health.step == 11


def test_a_restart_drops_the_shift() -> None:
    health = Health()
    health.beat(5, None)
    health.set_step(100)
    health.pause()
    assert health.step == 5
    health.beat(3, None)  # restarted from a checkpoint at step 3
    assert health.step == 3


def test_a_beat_without_a_step_keeps_it() -> None:
    health = Health()
    health.beat(5, None)
    health.set_step(100)
    health.beat(None, 0.5)
    assert health.step == 100 and health.metric == 0.5
