"""Starting or joining Ray the way DLU needs it."""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from dlu_prime import ray_workers, reaper
from dlu_prime.naming import NAMESPACE

logger = logging.getLogger(__name__)


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


def _skip_process(*args: Any, **kwargs: Any) -> None:
    del args, kwargs


def _unused_head_processes(options: dict[str, Any]) -> list[str]:
    """The `Node` methods that start head processes an embedded Ray never uses.

    `ray.init` starts them on every new head, with no option to leave them out:
    - the API server (Jobs and State REST APIs, usage stats), even with
      `include_dashboard=False`; `ray.init` then waits until it has published its URL, 1.5 to
      4 s here, and it binds port 8265 (or the next free one) for nothing;
    - the autoscaler monitor: one fixed local node has nothing to scale, and it delays
      `ray.shutdown` by about 1 s (it ignores SIGTERM until its loop wakes).
    Both are Python processes that import Ray, competing for the CPU with the job's start.
    """
    skipped = ["start_monitor"]
    if not options.get("include_dashboard"):
        skipped.append("start_api_server")
    return skipped


@contextmanager
def _lean_head(options: dict[str, Any]) -> Iterator[None]:
    """While Ray starts in this process, leave out the head processes a local run never uses, and
    give its raylet DLU's worker script (workers forked from a zygote, see dlu_prime.ray_workers).

    Uses Ray's private `Node` class; where a method has moved, Ray's default applies.
    """
    from ray._private.node import Node

    saved: dict[str, Any] = {}
    for name in _unused_head_processes(options):
        if callable(getattr(Node, name, None)):
            saved[name] = getattr(Node, name)
            setattr(Node, name, _skip_process)
        else:
            logger.debug("ray._private.node.Node.%s is gone; Ray starts that process", name)
    if ray_workers.enabled():
        original_init = Node.__init__
        saved["__init__"] = original_init

        def init_with_forked_workers(self: Any, ray_params: Any, *args: Any, **kwargs: Any) -> None:
            if getattr(ray_params, "worker_path", "unset") is None:  # Ray's default: its own script
                ray_params.worker_path = ray_workers.ENTRY_SCRIPT
            original_init(self, ray_params, *args, **kwargs)

        Node.__init__ = init_with_forked_workers
    try:
        yield
    finally:
        for name, method in saved.items():
            setattr(Node, name, method)


def init_local(**overrides: Any) -> str:
    """Start a private embedded Ray on this machine (loopback only, no dashboard); its address.

    Every process of it ends when this process does, however this one ends (dlu_prime.reaper)."""
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
        with _lean_head(options), reaper.marked():  # what this Ray starts ends with this process
            ray.init(**options)
    return str(ray.get_runtime_context().gcs_address)


def connect(address: str = "auto") -> None:
    """Join an existing Ray cluster (the launcher inside a Ray job)."""
    import ray

    quiet_ray_env()
    if not ray.is_initialized():
        ray.init(address=address, namespace=NAMESPACE, log_to_driver=False)
