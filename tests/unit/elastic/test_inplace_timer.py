"""InPlaceTimer: an in-place restart is timed from the failure to the moment every rank of
the new round has beaten a step it had not shown before, and only then, once."""

from __future__ import annotations

import pytest

from dlu_elastic.inplace_timer import ALIVE_S, InPlaceTimer

pytestmark = pytest.mark.timeout(10)

RANKS = ["j.t.0", "j.t.1"]


def trained(timer: InPlaceTimer, round_: int, step: int, now: float) -> list[float | None]:
    return [timer.beat(rank, round_, step, now) for rank in RANKS]


def test_timed_once_every_rank_beat_a_new_step_in_the_new_round() -> None:
    timer = InPlaceTimer()
    assert trained(timer, 0, 25, 1.0) == [None, None]  # nothing restarting: nothing timed
    timer.restarted(1, 10.0, RANKS)
    assert timer.timing
    # Agents beat their old process' last step while the new one starts; an old round's beat.
    assert trained(timer, 1, 25, 10.2) == [None, None]
    assert timer.beat("j.t.0", 0, 21, 10.3) is None
    assert timer.beat("j.t.0", 1, 21, 10.4) is None  # one rank back: not all yet
    assert timer.beat("j.t.0", 1, 22, 10.5) is None
    assert timer.beat("j.t.1", 1, 21, 10.75) == pytest.approx(0.75)
    assert not timer.timing
    assert trained(timer, 1, 23, 11.0) == [None, None]  # done: never timed twice


def test_a_rank_that_never_beat_counts_at_its_first_beat() -> None:
    timer = InPlaceTimer()
    timer.beat("j.t.0", 0, 5, 1.0)
    timer.restarted(1, 2.0, RANKS)
    assert timer.beat("j.t.1", 1, 0, 2.5) is None
    assert timer.beat("j.t.0", 1, 6, 3.0) == pytest.approx(1.0)


def test_a_second_failure_before_the_first_is_over_restarts_the_clock() -> None:
    timer = InPlaceTimer()
    trained(timer, 0, 10, 1.0)
    timer.restarted(1, 2.0, RANKS)
    timer.beat("j.t.0", 1, 3, 2.5)
    timer.restarted(2, 3.0, RANKS)
    assert timer.beat("j.t.1", 1, 4, 3.1) is None  # the dropped round
    assert timer.beat("j.t.0", 2, 4, 3.5) is None
    assert timer.beat("j.t.1", 2, 4, 4.0) == pytest.approx(1.0)


def test_a_role_failover_taking_over_is_not_timed_as_in_place() -> None:
    timer = InPlaceTimer()
    trained(timer, 0, 10, 1.0)
    timer.restarted(1, 2.0, RANKS)
    timer.cancel()
    assert trained(timer, 2, 11, 9.0) == [None, None]


def test_a_script_that_never_beats_counts_once_its_new_process_stayed_up() -> None:
    timer = InPlaceTimer()
    assert trained(timer, 1, 0, 1.0) == [None, None]  # an unmodified script: step 0 throughout
    timer.restarted(2, 5.0, RANKS)
    assert trained(timer, 1, 0, 5.1) == [None, None]  # the old round's beats
    assert trained(timer, 2, 0, 5.5) == [None, None]  # new processes started: not yet proven up
    assert timer.beat("j.t.0", 2, 0, 5.5 + ALIVE_S) is None  # one rank up long enough
    assert timer.timing
    took = timer.beat("j.t.1", 2, 0, 5.5 + ALIVE_S + 0.1)
    assert took == pytest.approx(0.5)  # timed to the processes' start, not to the proof
    assert not timer.timing


def test_a_script_that_never_beats_and_crashes_again_is_timed_from_the_second_failure() -> None:
    timer = InPlaceTimer()
    trained(timer, 1, 0, 1.0)
    timer.restarted(2, 5.0, RANKS)
    trained(timer, 2, 0, 5.5)  # started, then crashed before ALIVE_S: a new round opens
    timer.restarted(3, 6.0, RANKS)
    assert trained(timer, 2, 0, 5.5 + ALIVE_S) == [None, None]  # the dropped round proves nothing
    assert trained(timer, 3, 0, 6.25) == [None, None]
    assert trained(timer, 3, 0, 6.25 + ALIVE_S) == [None, pytest.approx(0.25)]


def test_beats_without_a_restart_never_time_anything() -> None:
    """Soak: many multiples of ALIVE_S of step-0 beats with nothing injected: nothing timed."""
    timer = InPlaceTimer()
    for i in range(400):
        assert trained(timer, 1, 0, i * 0.5) == [None, None]
    assert not timer.timing
