"""Soaks with short periods and nothing injected: a healthy Brain and a steady job raise nothing
beyond the job's start and its first measurement, the client never leaves cluster mode or drops a
sample, and a Cluster Monitor sampling a steady cluster raises idle resources once."""

from __future__ import annotations

import logging
import time
from pathlib import Path

import pytest

from dlu_brain import AdminSettings, Brain, BrainDatabase, BrainServer
from dlu_brain.monitor import ClusterMonitor, ClusterSample
from dlu_prime.brain_port import BrainClient, BrainMode, JobRegistration, RoleShape, StatSample

pytestmark = pytest.mark.timeout(300)


def _soak(tmp_path: Path, seconds: float, caplog: pytest.LogCaptureFixture) -> None:
    brain = Brain(BrainDatabase(f"sqlite:///{tmp_path / 'b.sqlite'}"), AdminSettings(min_samples=3))
    server = BrainServer(brain)
    server.serve_in_thread()
    client = BrainClient(server.url, retry_min_s=0.01, retry_max_s=0.05)
    shape = RoleShape(
        kind="elastic", size=2, min_size=2, max_size=2, elastic=True, actor_resources={"CPU": 1.0}
    )
    client.job_started(
        JobRegistration(name="lm", run_id="r", roles={"t": shape}, entrypoint="m:f", config_hash="h")
    )
    steady = ClusterSample(1, 0, {"CPU": 8.0}, {"CPU": 6.0}, [])
    monitor = ClusterMonitor(brain.cluster_sample, period_s=0.05, sample=lambda: steady)
    monitor.start()
    sent = 0
    caplog.set_level(logging.WARNING)
    try:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            client.report(
                [StatSample(time=time.time(), kind="throughput", role="t", world_size=2, samples_per_s=100.0)]
            )
            sent += 1
            assert client.mode is BrainMode.CLUSTER and client.buffered == 0
            time.sleep(0.01)
    finally:
        monitor.stop()
        client.close()
        server.shutdown()
        server.server_close()
    job = brain.db.find_job("lm", "r")
    assert job is not None
    assert client.dropped == 0 and len(brain.db.samples(job.id)) == sent
    assert [e.kind for e in brain.db.events(job.id)] == ["job_start", "throughput_measured"]
    assert brain.db.plans(job.id) == []  # at its only size: nothing to plan
    assert monitor.samples >= 2
    assert [r.getMessage() for r in caplog.records if r.name.startswith(("dlu_brain", "dlu_prime"))] == []


def test_short_soak_does_nothing(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    _soak(tmp_path, 3.0, caplog)


@pytest.mark.soak
def test_long_soak_does_nothing(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    _soak(tmp_path, 120.0, caplog)
