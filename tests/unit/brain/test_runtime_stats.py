"""Runtime statistics accumulators (dlu_prime.stats): throughput per world size, process use."""

from __future__ import annotations

import os

import pytest

from dlu_prime.stats import ProcessSampler, ThroughputMeter, backlog_sample

pytestmark = pytest.mark.timeout(30)


def test_throughput_per_world_size_from_heartbeats_and_samples() -> None:
    meter = ThroughputMeter()
    for t in range(5):  # two ranks at world size 2: 2 steps/s
        for rank in ("t-0", "t-1"):
            meter.observe_step("t", rank, step=2 * t, now=float(t), world_size=2)
        meter.observe_samples("t", count=64, now=float(t), world_size=2)
    meter.observe_step("t", "t-0", step=8, now=5.0, world_size=4)  # resized: a new interval
    meter.observe_step("t", "t-0", step=11, now=6.0, world_size=4)
    assert meter.by_size("t") == {2: pytest.approx(64.0), 4: pytest.approx(3.0)}
    summary = {(s.world_size): (s.steps_per_s, s.samples_per_s) for s in meter.summary()}
    assert summary == {2: (pytest.approx(2.0), pytest.approx(64.0)), 4: (pytest.approx(3.0), None)}
    drained = meter.drain(now=7.0)
    assert [(s.kind, s.role, s.world_size) for s in drained] == [
        ("throughput", "t", 2),
        ("throughput", "t", 4),
    ]
    assert meter.drain(now=8.0) == []  # nothing new since
    assert meter.by_size("t")[2] == pytest.approx(64.0)  # the totals stay


def test_a_restart_is_not_a_measurement() -> None:
    meter = ThroughputMeter()
    meter.observe_step("t", "t-0", 100, 0.0, 2)
    meter.observe_step("t", "t-0", 10, 1.0, 2)  # restarted from a checkpoint
    meter.forget_actor("t", "t-0")
    meter.observe_step("t", "t-0", 12, 2.0, 2)
    assert meter.by_size("t") == {}


def test_process_sampler_reads_this_process() -> None:
    sampler = ProcessSampler()
    first = sampler.sample(os.getpid(), 1.0, role="r", actor="a", memory_limit_bytes=2**40)
    assert first is not None and first.memory_bytes and first.memory_bytes > 2**20
    assert first.kind == "resource" and first.memory_limit_bytes == 2**40
    assert sampler.sample(2**22 + 12345, 1.0) is None  # no such process


def test_backlog_sample() -> None:
    s = backlog_sample("rollouts", -3, 2.0, role="rollout")
    assert (s.kind, s.channel, s.backlog, s.role) == ("backlog", "rollouts", 0, "rollout")
