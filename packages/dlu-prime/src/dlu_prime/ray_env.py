"""Starting or joining Ray the way DLU needs it."""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from typing import Any

from dlu_prime import ray_private, ray_workers, reaper
from dlu_prime.naming import NAMESPACE

logger = logging.getLogger(__name__)


def quiet_ray_env() -> None:
    """Settings that must be in the environment before Ray starts its workers."""
    # Under `uv run`, Ray would re-run every worker through uv with the repo as working_dir.
    os.environ.setdefault("RAY_ENABLE_UV_RUN_RUNTIME_ENV", "0")


LOOPBACK = "127.0.0.1"

# The raylet connects to the object store it has just started in a thread of its own; when that
# thread has not bound its socket yet (two busy cores: the torch zygote imports meanwhile), the
# connect fails and Ray waits its retry interval, 1 s by default, before the next try. That was
# the extra second of a third of the embedded Ray's starts (raylet.out: "Plasma store debug dump"
# 1.0 s before "ObjectManager server started"). The same retry serves every worker connecting to
# the raylet. Same 10 s in all, tried every 50 ms.
FAST_CONNECT_RETRY: dict[str, str] = {
    "RAY_raylet_client_connect_timeout_milliseconds": "50",
    "RAY_raylet_client_num_connect_attempts": "200",
}


def fast_connect_retry(environ: Mapping[str, str]) -> dict[str, str]:
    """The retry settings `init_local` adds to its environment: none if the user set either."""
    if any(name in environ for name in FAST_CONNECT_RETRY):
        return {}
    return dict(FAST_CONNECT_RETRY)


# The Ray internals a local head needs live in dlu_prime.ray_private, guarded; re-exported here
# for the tests and scripts that start loopback clusters themselves.
pin_loopback = ray_private.pin_loopback


def init_local(**overrides: Any) -> str:
    """Start a private embedded Ray on this machine (loopback only, no dashboard); its address.

    A lean head: `ray.init` would also start, with no option to leave them out, the API server
    (even with `include_dashboard=False`: `ray.init` waits 1.5 to 4 s for its URL, and it binds
    port 8265 for nothing) and the autoscaler monitor (nothing to scale on one fixed node; it
    delays `ray.shutdown` by about 1 s), two Python processes importing Ray beside the job's
    start; and, with `log_to_driver=False` (a quiet `dlu run`), the log monitor, a third, whose
    one job is forwarding worker output to drivers. Its raylet starts workers through DLU's
    zygote (dlu_prime.ray_workers).
    Every process of it ends when this process does, however this one ends (dlu_prime.reaper)."""
    import ray

    quiet_ray_env()
    if not ray.is_initialized():
        os.environ.update(fast_connect_retry(os.environ))  # the raylet and its workers inherit it
        options: dict[str, Any] = {
            "address": "local",
            "namespace": NAMESPACE,
            "include_dashboard": False,
            "_node_ip_address": LOOPBACK,
            "log_to_driver": True,
        }
        options.update(overrides)
        lean = ray_private.lean_head(
            skip_api_server=not options.get("include_dashboard"),
            worker_script=ray_workers.ENTRY_SCRIPT if ray_workers.enabled() else None,
            skip_log_monitor=not options.get("log_to_driver"),  # it only forwards worker output
            stub_agent=ray_private.agent_stub_enabled(),
        )
        with pin_loopback(), lean, reaper.marked():  # what this Ray starts ends with this process
            ray.init(**options)
        if not options.get("log_to_driver"):  # quiet: no "(raylet) A worker died ..." either
            ray_private.quiet_raylet_messages()
    return str(ray.get_runtime_context().gcs_address)


def connect(address: str = "auto") -> None:
    """Join an existing Ray cluster (the launcher inside a Ray job)."""
    import ray

    quiet_ray_env()
    if not ray.is_initialized():
        ray.init(address=address, namespace=NAMESPACE, log_to_driver=False)
