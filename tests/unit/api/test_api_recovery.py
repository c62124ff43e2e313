"""Pairing failures with the recovery that followed them, and the lines `dlu status` prints."""

from __future__ import annotations

import pytest

from dlu_api.recovery import recoveries, recovery_line, recovery_lines
from dlu_api.status import JobEvent

pytestmark = pytest.mark.timeout(10)


def ev(t: float, kind: str, role: str | None = None, actor: str | None = None) -> JobEvent:
    return JobEvent(time=t, kind=kind, message=kind, role=role, actor=actor)


def test_a_failure_pairs_with_the_next_completion() -> None:
    found = recoveries([ev(1, "stage"), ev(10, "died", "w", "w.1"), ev(13.25, "actors_restarted")])
    assert len(found) == 1
    assert found[0].failure.kind == "died" and found[0].done is not None
    assert found[0].duration_s == pytest.approx(3.25)
    assert recovery_line(found[0]) == "  recovered in 3.25 s: w/w.1 died -> actors_restarted"


def test_overlapping_failures_are_one_recovery_timed_from_the_first() -> None:
    events = [
        ev(10, "died", "w"),
        ev(11, "heartbeat_timeout", "w"),
        ev(12, "actors_restarting"),
        ev(15, "actors_restarted"),
    ]
    found = recoveries(events)
    assert [(r.failure.kind, r.duration_s) for r in found] == [("died", 5.0)]


def test_roles_are_kept_apart() -> None:
    events = [ev(10, "died", "a"), ev(11, "died", "b"), ev(14, "recovered", "b")]
    found = recoveries(events)
    assert [(r.failure.role, r.recovered, r.duration_s) for r in found] == [
        ("a", False, None),
        ("b", True, 3.0),
    ]
    assert recovery_line(found[0]) == "  not recovered: a died"


def test_a_duration_on_the_completion_event_wins() -> None:
    class Timed(JobEvent):  # what a PrimeMaster with the failover ladder records
        duration_s: float | None = None
        tier: str | None = None

    done = Timed(time=20, kind="failover_done", message="back", role="w", duration_s=1.2, tier="in-place")
    found = recoveries([ev(10, "failover_started", "w"), done])
    assert [(r.duration_s, r.tier) for r in found] == [(1.2, "in-place")]
    assert recovery_line(found[0]).startswith("  recovered in 1.20 s (in-place tier): w failover_started")
    alone = recoveries([done])  # nothing to pair, but it carries its own figure
    assert [(r.failure.kind, r.duration_s) for r in alone] == [("failover_done", 1.2)]


def test_extra_fields_from_a_newer_master_are_read_too() -> None:
    done = JobEvent.model_validate({"time": 5, "kind": "failover_done", "message": "", "duration_s": 0.7})
    found = recoveries([ev(4, "died"), done])
    assert found[0].duration_s in (0.7, 1.0)  # 0.7 where the model keeps extra fields, else paired


def test_no_failures_no_lines() -> None:
    assert recovery_lines([ev(1, "stage"), ev(2, "actors_restarted")]) == []
    assert recovery_lines([ev(1, "died")], limit=0) == []
