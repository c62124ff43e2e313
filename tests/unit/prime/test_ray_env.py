"""The embedded Ray leaves out the head processes a local run never uses, and only while it starts."""

from __future__ import annotations

import os
from typing import Any

import pytest
from ray._private.node import Node

from dlu_prime import ray_private

pytestmark = pytest.mark.timeout(60)

METHODS = ("start_api_server", "start_monitor", "__init__")
skip = ray_private._skip_process  # pyright: ignore[reportPrivateUsage]


def _current() -> dict[str, Any]:
    return {name: getattr(Node, name) for name in METHODS}


def test_api_server_and_monitor_are_skipped_while_ray_starts_then_restored() -> None:
    before = _current()
    with ray_private.lean_head(skip_api_server=True, worker_script=None):
        assert Node.start_api_server is skip and Node.start_monitor is skip
        assert Node.__init__ is before["__init__"]  # no worker script asked for
    assert _current() == before


def test_a_requested_dashboard_is_started() -> None:
    before = _current()
    with ray_private.lean_head(skip_api_server=False, worker_script=None):
        assert Node.start_api_server is before["start_api_server"]
        assert Node.start_monitor is skip
    assert _current() == before


def test_the_worker_script_is_given_to_the_raylet_with_rays_own_in_the_environment() -> None:
    before = _current()
    assert ray_private.DEFAULT_WORKER_ENV not in os.environ
    with ray_private.lean_head(skip_api_server=True, worker_script="/x/entry.py"):
        assert Node.__init__ is not before["__init__"]
        script = os.environ[ray_private.DEFAULT_WORKER_ENV]
        assert script == ray_private.default_worker_script() and script.endswith("default_worker.py")
    assert _current() == before and ray_private.DEFAULT_WORKER_ENV not in os.environ


def test_restored_when_ray_fails_to_start() -> None:
    before = _current()
    with (
        pytest.raises(RuntimeError),
        ray_private.lean_head(skip_api_server=True, worker_script="/x/entry.py"),
    ):
        raise RuntimeError("ray.init failed")
    assert _current() == before and ray_private.DEFAULT_WORKER_ENV not in os.environ


def test_a_method_ray_no_longer_has_is_left_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delattr(Node, "start_monitor")
    monkeypatch.setattr(ray_private, "_checked", {})
    with ray_private.lean_head(skip_api_server=True, worker_script=None):
        assert not hasattr(Node, "start_monitor")
        assert Node.start_api_server is skip
    assert not hasattr(Node, "start_monitor")


def test_the_log_monitor_is_left_out_only_when_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    """A quiet `dlu run` forwards no worker output: Ray's log monitor, which only does that, is
    not started; otherwise (and for a RayParams that names it) Ray's choice stands."""
    from ray._private.parameter import RayParams

    seen: list[Any] = []

    def record(self: Any, ray_params: Any, *args: Any, **kwargs: Any) -> None:
        del self, args, kwargs
        seen.append(ray_params.include_log_monitor)

    monkeypatch.setattr(Node, "__init__", record)
    monkeypatch.setattr(ray_private, "_checked", {})
    with ray_private.lean_head(skip_api_server=True, worker_script=None, skip_log_monitor=True):
        Node.__init__(object.__new__(Node), RayParams())
        Node.__init__(object.__new__(Node), RayParams(include_log_monitor=True))
    with ray_private.lean_head(skip_api_server=True, worker_script=None):
        assert Node.__init__ is record
        Node.__init__(object.__new__(Node), RayParams())
    assert seen == [False, True, None]
    assert Node.__init__ is record


def test_the_embedded_ray_retries_its_socket_connects_every_50_ms_for_the_same_10_s() -> None:
    """Ray's default waits 1 s after a connect that came too early (the raylet to its own store)."""
    from dlu_prime.ray_env import fast_connect_retry

    added = fast_connect_retry({"PATH": "/bin"})
    interval_ms = int(added["RAY_raylet_client_connect_timeout_milliseconds"])
    attempts = int(added["RAY_raylet_client_num_connect_attempts"])
    assert interval_ms == 50 and interval_ms * attempts == 10 * 1000  # Ray's default: 10 x 1000 ms


@pytest.mark.parametrize(
    "users", ["RAY_raylet_client_connect_timeout_milliseconds", "RAY_raylet_client_num_connect_attempts"]
)
def test_a_users_own_retry_setting_is_left_alone(users: str) -> None:
    """Either setting alone changes what the other means (the total wait), so neither is added."""
    from dlu_prime.ray_env import fast_connect_retry

    assert fast_connect_retry({users: "3000"}) == {}
