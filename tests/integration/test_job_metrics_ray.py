"""JobMetrics under a real Ray: created and recorded inside an actor (where the PrimeMaster
calls it) without error, and, when this node's metrics agent answers, exported under our names.

The tests' Ray (plain `ray`) has no metrics agent, so the export test skips, saying so; the
export is checked where one runs: test_remote_cluster.py's
`test_job_metrics_reach_prometheus_through_ray` (`ray[default]`)."""

from __future__ import annotations

import time
import urllib.request
from typing import Any

import pytest

pytestmark = [pytest.mark.ray, pytest.mark.timeout(120)]

EXPORT_WAIT_S = 45.0  # Ray's agent exports on its report interval (seconds)


def _scrape(port: int) -> str | None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
            return response.read().decode()
    except OSError:
        return None


def _record_in_an_actor(ray: Any) -> Any:
    """Record a job's metrics inside an actor, as the PrimeMaster does; the actor (to kill)."""

    @ray.remote(num_cpus=0)
    class Recorder:
        def record(self) -> bool:
            from dlu_api.spec import spec_from_dict
            from dlu_api.status import JobStage
            from dlu_prime.master.manager import new_state
            from dlu_prime.master.metrics import JobMetrics

            spec = spec_from_dict(
                {
                    "name": "metrics-it",
                    "device_type": "CPU",
                    "device_per_node": 0,
                    "roles": [{"name": "trainer", "entrypoint": "pkg.t:main", "total": 2}],
                }
            )
            state = new_state(spec)
            state.stage = JobStage.RUNNING
            state.roles["trainer"].restart_count = 1
            metrics = JobMetrics("metrics-it")
            metrics.observe_state(state, {"metrics-it.trainer.0": 2.0})
            metrics.failover_done("role", 1.25)
            metrics.node_check_scores({"node-a": 0.5})
            return metrics.enabled

    recorder = Recorder.remote()  # type: ignore[attr-defined]
    assert ray.get(recorder.record.remote(), timeout=60) is True
    return recorder


def test_metrics_record_inside_an_actor(ray_session: Any) -> None:
    ray_session.kill(_record_in_an_actor(ray_session))


def test_recorded_metrics_are_exported_by_the_metrics_agent(ray_session: Any) -> None:
    ray = ray_session
    port = ray._private.worker.global_worker.node.metrics_export_port
    if port is None or port <= 0 or _scrape(port) is None:
        pytest.skip(
            "this Ray runs no metrics agent (plain `ray`, not `ray[default]`): nothing exports; "
            "test_remote_cluster.py::test_job_metrics_reach_prometheus_through_ray checks the export"
        )
    recorder = _record_in_an_actor(ray)
    try:
        deadline = time.monotonic() + EXPORT_WAIT_S
        text = ""
        while time.monotonic() < deadline:
            text = _scrape(port) or ""
            if "dlu_failover_duration_seconds" in text and "dlu_job_stage" in text:
                break
            time.sleep(1.0)
        assert "dlu_failover_duration_seconds" in text, "metrics not exported within the wait"
        assert 'dlu_job="metrics-it"' in text
    finally:
        ray.kill(recorder)
