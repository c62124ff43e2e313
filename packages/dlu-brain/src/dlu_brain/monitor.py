"""The Cluster Monitor for Ray: nodes, total and free resources, and the demand Ray cannot place
yet, sampled through Ray's public API and handed to the Brain (which stores it and lets every
administrator see idle resources)."""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from typing import Any

from dlu_prime import ray_private

logger = logging.getLogger(__name__)

# Ray's state API lives in its dashboard. Without one (`include_dashboard=False`, a minimal Ray)
# a call waits 40 s to find that out (measured on Ray 2.60), so the dashboard's address is looked
# up first; a call gets a short timeout, and after a failure the demand is not asked for again
# for a while.
STATE_API_TIMEOUT_S = 3
STATE_API_RETRY_S = 300.0
_state_api_down_until = float("-inf")


@dataclass(frozen=True)
class ClusterSample:
    alive: int
    dead: int
    total: dict[str, float]
    available: dict[str, float]
    pending: list[dict[str, float]]


def _amounts(data: dict[str, Any]) -> dict[str, float]:
    # node:<ip> and the internal "accelerator_type:*" markers are not capacity
    return {k: float(v) for k, v in data.items() if not k.startswith("node:") and isinstance(v, int | float)}


def sample_ray(with_demand: bool = True) -> ClusterSample:
    """One sample of the Ray cluster this process is connected to (`ray.init` done);
    `with_demand=False` leaves out the pending demand (the one part that may be slow)."""
    import ray

    nodes = ray.nodes()
    alive = sum(1 for n in nodes if n.get("Alive"))
    return ClusterSample(
        alive=alive,
        dead=len(nodes) - alive,
        total=_amounts(ray.cluster_resources()),
        available=_amounts(ray.available_resources()),
        pending=_pending_demand() if with_demand else [],
    )


def _pending_demand() -> list[dict[str, float]]:
    """What actors waiting for resources ask for (ray.util.state, which needs Ray's dashboard;
    without it the demand is unknown and left empty)."""
    global _state_api_down_until
    if time.monotonic() < _state_api_down_until:
        return []
    try:
        from ray.util.state import list_actors

        if not ray_private.dashboard_running():
            raise ConnectionError("this Ray runs no dashboard")
        waiting = list_actors(
            filters=[("state", "=", "PENDING_CREATION")],
            detail=True,
            raise_on_missing_output=False,
            timeout=STATE_API_TIMEOUT_S,
        )
    except Exception as exc:  # no dashboard (a minimal Ray), or it is starting
        _state_api_down_until = time.monotonic() + STATE_API_RETRY_S
        logger.info(
            "pending demand unknown (Ray's state API: %s); asked again in %.0fs", exc, STATE_API_RETRY_S
        )
        return []
    out: list[dict[str, float]] = []
    for actor in waiting:
        asks = getattr(actor, "required_resources", None) or {}
        out.append({str(k): float(v) for k, v in dict(asks).items()})
    return out


class ClusterMonitor:
    """Samples every `period_s` seconds in a daemon thread until `stop()`."""

    def __init__(self, report: Any, period_s: float = 10.0, sample: Any = sample_ray) -> None:
        self._report = report
        self._sample = sample
        self.period_s = period_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="dlu-cluster-monitor", daemon=True)
        self.samples = 0

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=self.period_s + 5)

    def once(self) -> None:
        s = self._sample()
        self._report(s.alive, s.dead, s.total, s.available, s.pending)
        self.samples += 1

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.once()
            except Exception as exc:  # the database down, Ray's GCS restarting: sample again later
                logger.warning("cluster monitor: %s", exc)
            self._stop.wait(self.period_s)
