"""Starting or joining Ray the way DLU needs it."""

from __future__ import annotations

import os
from typing import Any

from dlu_prime.naming import NAMESPACE


def quiet_ray_env() -> None:
    """Settings that must be in the environment before Ray starts its workers."""
    # Under `uv run`, Ray would re-run every worker through uv with the repo as working_dir.
    os.environ.setdefault("RAY_ENABLE_UV_RUN_RUNTIME_ENV", "0")


LOOPBACK = "127.0.0.1"


def pin_loopback() -> None:
    """Keep an embedded Ray on 127.0.0.1.

    Ray rewrites 127.0.0.1 (as node IP or address) to the host's interface address, so a
    "local" Ray would listen on the network. A local run must not, so the rewrite is turned off
    for this process (Ray's private helper; if it ever moves, Ray's default applies).
    """
    from ray._private import services

    if hasattr(services, "resolve_ip_for_localhost"):
        services.resolve_ip_for_localhost = lambda host: host  # pyright: ignore[reportAttributeAccessIssue]


def init_local(**overrides: Any) -> str:
    """Start a private embedded Ray on this machine (loopback only, no dashboard); its address."""
    import ray

    quiet_ray_env()
    pin_loopback()
    if not ray.is_initialized():
        options: dict[str, Any] = {
            "address": "local",
            "namespace": NAMESPACE,
            "include_dashboard": False,
            "_node_ip_address": LOOPBACK,
            "log_to_driver": True,
        }
        options.update(overrides)
        ray.init(**options)
    return str(ray.get_runtime_context().gcs_address)


def connect(address: str = "auto") -> None:
    """Join an existing Ray cluster (the launcher inside a Ray job)."""
    import ray

    quiet_ray_env()
    if not ray.is_initialized():
        ray.init(address=address, namespace=NAMESPACE, log_to_driver=False)
