"""What the launcher publishes for remote drivers: each event once, the status when it changes
(at once for a change of state, at most every interval for steps alone)."""

from __future__ import annotations

import pytest

from dlu_api.client import wire
from dlu_api.status import ActorStatus, JobEvent, JobStage, JobStatus, RoleStatus
from dlu_prime import publish

pytestmark = pytest.mark.timeout(30)


def status(step: int | None = 1, stage: str = "RUNNING", events: int = 0) -> JobStatus:
    actor = ActorStatus(name="j.w.0", role="w", rank=0, stage=stage, step=step)
    return JobStatus(
        name="j",
        stage=JobStage.RUNNING,
        roles=[RoleStatus(name="w", kind="custom", actors=[actor])],
        events=[JobEvent(time=float(i), kind="k", message=f"e{i}", seq=i + 1) for i in range(events)],
    )


def test_due_publishes_a_change_of_state_at_once_and_steps_alone_per_interval() -> None:
    first = status(step=1)
    assert publish.due(None, 0.0, first, 0.0, 5.0)
    assert not publish.due(first, 0.0, first, 100.0, 5.0)  # nothing changed
    assert not publish.due(first, 0.0, status(step=2), 4.9, 5.0)  # steps only, inside the interval
    assert publish.due(first, 0.0, status(step=2), 5.0, 5.0)
    assert publish.due(first, 0.0, status(step=1, stage="FAILED"), 0.1, 5.0)  # an actor's state
    assert not publish.due(first, 0.0, status(step=1, events=3), 0.1, 5.0)  # events go as lines


def test_publisher_writes_every_event_once_and_statuses_without_events() -> None:
    lines: list[str] = []
    now = [0.0]
    publisher = publish.StatusPublisher(lines.append, 5.0, clock=lambda: now[0])
    publisher(status(step=1, events=2))
    now[0] = 1.0
    publisher(status(step=2, events=3))  # one new event; steps only: no status yet
    now[0] = 6.0
    publisher(status(step=3, events=3))
    final = status(step=3, events=4).model_copy(update={"stage": JobStage.STOPPED, "exit_code": 0})
    publisher.final(final)
    report = wire.parse_log(lines)
    assert [e.message for e in report.events] == ["e0", "e1", "e2", "e3"]
    statuses = [line for line in lines if line.startswith(wire.STATUS)]
    assert len(statuses) == 3  # the first, the one past the interval, the final
    assert report.current == final.model_copy(update={"events": report.events})
    assert wire.parse_log(statuses[:2]).status == status(step=3)  # published without events


def test_interval_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(publish.STATUS_INTERVAL_ENV, "0.5")
    assert publish.status_interval_s() == 0.5
    monkeypatch.setenv(publish.STATUS_INTERVAL_ENV, "soon")
    with pytest.raises(ValueError, match="DLU_STATUS_INTERVAL_S='soon' is not allowed: give a number"):
        publish.status_interval_s()
