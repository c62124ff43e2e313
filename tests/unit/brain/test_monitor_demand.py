"""The pending demand comes from Ray's state API, which lives in the dashboard: without one, a
call waits for its whole timeout. The monitor asks with a short timeout and, after a failure,
not again for a while, so a sample stays quick."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
import ray.util.state

from dlu_brain import monitor
from dlu_prime import ray_private


def test_a_missing_state_api_is_asked_once_then_left_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[dict[str, Any]] = []

    def no_dashboard(**kwargs: Any) -> list[Any]:
        calls.append(kwargs)
        raise ConnectionError("no dashboard")

    monkeypatch.setattr(ray.util.state, "list_actors", no_dashboard)
    monkeypatch.setattr(ray_private, "dashboard_running", lambda: True)
    monkeypatch.setattr(monitor, "_state_api_down_until", float("-inf"))
    clock = [1000.0]
    monkeypatch.setattr(monitor, "time", SimpleNamespace(monotonic=lambda: clock[0]))
    assert monitor._pending_demand() == []
    assert calls and calls[0]["timeout"] == monitor.STATE_API_TIMEOUT_S
    for _ in range(10):
        clock[0] += monitor.STATE_API_RETRY_S / 20
        assert monitor._pending_demand() == []
    assert len(calls) == 1  # left alone within the retry period
    clock[0] += monitor.STATE_API_RETRY_S
    monitor._pending_demand()
    assert len(calls) == 2  # asked again after it


def test_the_demand_is_what_waiting_actors_ask_for(monkeypatch: pytest.MonkeyPatch) -> None:
    class Waiting:
        required_resources = {"CPU": 2, "GPU": 1}

    monkeypatch.setattr(ray.util.state, "list_actors", lambda **kwargs: [Waiting()])
    monkeypatch.setattr(ray_private, "dashboard_running", lambda: True)
    monkeypatch.setattr(monitor, "_state_api_down_until", float("-inf"))
    assert monitor._pending_demand() == [{"CPU": 2.0, "GPU": 1.0}]


def test_without_a_dashboard_the_state_api_is_not_called(monkeypatch: pytest.MonkeyPatch) -> None:
    called: list[bool] = []
    monkeypatch.setattr(ray.util.state, "list_actors", lambda **kwargs: called.append(True) or [])
    monkeypatch.setattr(ray_private, "dashboard_running", lambda: False)
    monkeypatch.setattr(monitor, "_state_api_down_until", float("-inf"))
    assert monitor._pending_demand() == [] and not called
