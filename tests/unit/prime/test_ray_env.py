"""The embedded Ray leaves out the head processes a local run never uses, and only while it starts."""

from __future__ import annotations

from typing import Any

import pytest
from ray._private.node import Node

from dlu_prime import ray_env

METHODS = ("start_api_server", "start_monitor")


def _current() -> dict[str, Any]:
    return {name: getattr(Node, name) for name in METHODS}


def test_api_server_and_monitor_are_skipped_while_ray_starts_then_restored() -> None:
    before = _current()
    with ray_env._lean_head({"include_dashboard": False}):  # pyright: ignore[reportPrivateUsage]
        assert all(getattr(Node, name) is ray_env._skip_process for name in METHODS)  # pyright: ignore[reportPrivateUsage]
    assert _current() == before


def test_a_requested_dashboard_is_started() -> None:
    before = _current()
    with ray_env._lean_head({"include_dashboard": True}):  # pyright: ignore[reportPrivateUsage]
        assert Node.start_api_server is before["start_api_server"]
        assert Node.start_monitor is ray_env._skip_process  # pyright: ignore[reportPrivateUsage]
    assert _current() == before


def test_restored_when_ray_fails_to_start() -> None:
    before = _current()
    with pytest.raises(RuntimeError), ray_env._lean_head({}):  # pyright: ignore[reportPrivateUsage]
        raise RuntimeError("ray.init failed")
    assert _current() == before


def test_a_method_ray_no_longer_has_is_left_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delattr(Node, "start_monitor")
    with ray_env._lean_head({}):  # pyright: ignore[reportPrivateUsage]
        assert not hasattr(Node, "start_monitor")
        assert Node.start_api_server is ray_env._skip_process  # pyright: ignore[reportPrivateUsage]
    assert not hasattr(Node, "start_monitor")
