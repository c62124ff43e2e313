"""The Cluster Monitor on a real local Ray: nodes, total and free resources reach the Brain's
database, an actor holding CPUs shows as less free, and an administrator sees idle resources once."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from dlu_brain import Brain, BrainDatabase
from dlu_brain.monitor import ClusterMonitor, sample_ray
from dlu_prime.brain_port import JobRegistration, RoleShape

pytestmark = [pytest.mark.ray, pytest.mark.timeout(120)]


def test_monitor_records_the_cluster_and_raises_idle_resources(ray_session: Any, tmp_path: Path) -> None:
    ray = ray_session
    brain = Brain(BrainDatabase(f"sqlite:///{tmp_path / 'b.sqlite'}"))
    brain.resume()
    shape = RoleShape(kind="simple", size=1, min_size=1, max_size=4, actor_resources={"CPU": 1.0})
    brain.start_job(
        JobRegistration(name="w", run_id="r", roles={"reader": shape}, entrypoint="m:f", config_hash="h")
    )
    monitor = ClusterMonitor(brain.cluster_sample, period_s=0.2)
    monitor.start()
    try:
        deadline = time.monotonic() + 30
        while monitor.samples < 2:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        first = brain.db.latest_cluster_sample()
        assert first is not None and first["nodes_alive"] >= 1 and first["total"]["CPU"] >= 1

        @ray.remote(num_cpus=2)
        class Holder:
            def ready(self) -> bool:
                return True

        # Measured as what its end gives back: an earlier test's actors may still be ending
        # meanwhile, which only adds free CPUs (a drop from before the actor would miss them).
        holder = Holder.remote()
        ray.get(holder.ready.remote(), timeout=60)
        seen: list[float] = []  # Ray's free count lags a placement: its lowest over 2 s
        until = time.monotonic() + 2.0
        while time.monotonic() < until:
            seen.append(sample_ray(with_demand=False).available.get("CPU", 0.0))
            time.sleep(0.1)
        held = min(seen)
        ray.kill(holder)
        while sample_ray(with_demand=False).available.get("CPU", 0.0) < held + 2 - 1e-6:
            assert time.monotonic() < deadline + 30, (held, sample_ray(with_demand=False).available)
            time.sleep(0.1)
    finally:
        monitor.stop()
    job = brain.db.find_job("w", "r")
    assert job is not None
    idle = [e for e in brain.db.events(job.id) if e.kind == "idle_resources"]
    assert len(idle) == 1  # raised once, not at every sample
    assert idle[0].role == "reader" and idle[0].detail["available"]["CPU"] >= 1
    # nothing measured for the reader yet: marginal scaling has nothing to go on, no plan
    assert idle[0].state == "no_change"
