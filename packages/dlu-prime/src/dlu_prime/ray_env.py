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


AUTH_MODE_ENV = "RAY_AUTH_MODE"


def auth_mode() -> str | None:
    """Ray's authentication mode of this process (an embedded Ray may have turned tokens on)."""
    return os.environ.get(AUTH_MODE_ENV)


def connect(address: str = "auto", auth: str | None = None) -> None:
    """Join an existing Ray cluster (the launcher inside a Ray job, or `dlu stop` of a local run).

    `auth` is the cluster's RAY_AUTH_MODE when known: a local Ray started with a token in
    ~/.ray/auth_token only accepts drivers that also use token mode.
    """
    import ray

    quiet_ray_env()
    if auth and os.environ.get(AUTH_MODE_ENV) != auth:
        os.environ[AUTH_MODE_ENV] = auth
        # Ray caches its config when imported; re-read it, as Ray itself does when it turns
        # token mode on for a local cluster.
        from ray._raylet import Config  # pyright: ignore[reportPrivateImportUsage, reportAttributeAccessIssue]

        Config.initialize("")
    if not ray.is_initialized():
        ray.init(address=address, namespace=NAMESPACE, log_to_driver=False)
