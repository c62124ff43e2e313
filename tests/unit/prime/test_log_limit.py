"""LogLimiter: a line per kind per interval with the count since the last, on a fake clock."""

from __future__ import annotations

import pytest

from dlu_prime.log_limit import LogLimiter, Report

pytestmark = pytest.mark.timeout(60)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


def test_the_first_event_is_reported_at_once_and_a_burst_once_its_interval_is_up(clock: Clock) -> None:
    limiter = LogLimiter(10.0, clock)
    assert limiter.record("bad token", "call 0") == Report("bad token", 1, "call 0", None)
    for i in range(1, 2000):
        clock.now += 0.001
        assert limiter.record("bad token", f"call {i}") is None
    assert limiter.due() == []  # not yet
    assert limiter.next_due_at() == 1010.0
    clock.now = 1010.0
    [report] = limiter.due()
    assert (report.count, report.latest, report.since_s) == (1999, "call 1999", 10.0)
    assert limiter.due() == [] and limiter.next_due_at() is None


def test_kinds_are_counted_apart(clock: Clock) -> None:
    limiter = LogLimiter(10.0, clock)
    assert limiter.record("a") is not None
    assert limiter.record("b") is not None  # another kind's first: at once
    assert limiter.record("a") is None
    assert limiter.record("a") is None
    assert limiter.record("b") is None
    clock.now += 10
    assert sorted((r.kind, r.count) for r in limiter.due()) == [("a", 2), ("b", 1)]


def test_an_event_after_a_quiet_interval_is_reported_at_once_with_the_ones_before_it(clock: Clock) -> None:
    limiter = LogLimiter(10.0, clock)
    limiter.record("k")
    clock.now += 3
    assert limiter.record("k") is None
    clock.now += 30  # nobody asked what was due: the next event carries both
    report = limiter.record("k", "late")
    assert report == Report("k", 2, "late", 33.0)


def test_drain_reports_what_is_counted_due_or_not(clock: Clock) -> None:
    limiter = LogLimiter(10.0, clock)
    limiter.record("k")
    limiter.record("k")
    clock.now += 1
    assert limiter.drain() == [Report("k", 1, "", 1.0)]
    assert limiter.drain() == []


def test_a_steady_stream_is_one_line_per_interval_and_every_event_is_counted_once(clock: Clock) -> None:
    limiter = LogLimiter(10.0, clock)
    reports: list[Report] = []
    for _ in range(3600):  # one event a second for an hour, the timer checked every second
        clock.now += 1.0
        found = limiter.record("k")
        reports += [found] if found else []
        reports += limiter.due()
    reports += limiter.drain()
    assert sum(r.count for r in reports) == 3600
    assert 360 <= len(reports) <= 361
    assert all(r.count <= 10 for r in reports)


def test_soak_nothing_refused_over_many_intervals_writes_nothing(clock: Clock) -> None:
    limiter = LogLimiter(10.0, clock)
    for _ in range(100_000):  # about 11 days of timer ticks at the interval
        clock.now += 10.0
        assert limiter.due() == []
        assert limiter.next_due_at() is None
    assert limiter.drain() == []


def test_soak_one_burst_then_quiet_is_two_lines_then_none(clock: Clock) -> None:
    limiter = LogLimiter(10.0, clock)
    lines = [limiter.record("k") for _ in range(50)]
    assert len([line for line in lines if line]) == 1
    later: list[Report] = []
    for _ in range(10_000):
        clock.now += 7.0
        later += limiter.due()
    assert [r.count for r in later] == [49]
    assert limiter.next_due_at() is None


def test_the_interval_must_be_positive() -> None:
    with pytest.raises(ValueError, match="interval_s"):
        LogLimiter(0)
