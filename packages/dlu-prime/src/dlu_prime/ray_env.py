"""Starting or joining Ray the way DLU needs it."""

from __future__ import annotations

import os
from typing import Any

from dlu_prime.naming import NAMESPACE


def quiet_ray_env() -> None:
    """Settings that must be in the environment before Ray starts its workers."""
    # Under `uv run`, Ray would re-run every worker through uv with the repo as working_dir.
    os.environ.setdefault("RAY_ENABLE_UV_RUN_RUNTIME_ENV", "0")


def init_local(**overrides: Any) -> str:
    """Start a private embedded Ray on this machine (loopback only, no dashboard); its address."""
    import ray

    quiet_ray_env()
    if not ray.is_initialized():
        options: dict[str, Any] = {
            "address": "local",
            "namespace": NAMESPACE,
            "include_dashboard": False,
            "_node_ip_address": "127.0.0.1",
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
