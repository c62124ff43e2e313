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


def test_a_short_window_at_the_current_size_waits_for_the_next_report_one_at_a_size_left_is_sent() -> None:
    """Issue 30: the Brain averages the samples it gets; the short first window after a resize
    (a few whole steps) weighed as much as a full one and pulled a size's speed down by 7%."""
    meter = ThroughputMeter()
    meter.observe_step("t", "t-0", 0, 0.0, 4)
    meter.observe_step("t", "t-0", 2, 1.0, 4)  # one second measured: 2 steps/s
    assert meter.drain(now=1.0, min_span_s=10.0) == []  # kept: too short to stand alone
    for t in range(2, 12):
        meter.observe_step("t", "t-0", 2 + 3 * (t - 1), float(t), 4)  # then 3 steps/s
    (sample,) = meter.drain(now=11.0, min_span_s=10.0)
    assert sample.world_size == 4 and sample.steps_per_s == pytest.approx(32 / 11)  # one window of 11 s
    meter.observe_step("t", "t-0", 40, 12.0, 4)
    meter.observe_step("t", "t-0", 41, 13.0, 2)  # resized to 2: the size-4 window is done
    (left,) = meter.drain(now=13.0, min_span_s=10.0)
    assert left.world_size == 4 and left.steps_per_s == pytest.approx(40 - 32)
    meter.observe_step("t", "t-0", 43, 14.0, 2)
    (final,) = meter.drain(now=14.0)  # the job's last report sends what it has
    assert final.world_size == 2


def test_polls_between_bursts_of_relayed_steps_count_their_time() -> None:
    """Issue 30: an elastic rank's steps reach the PrimeMaster in bursts (its agent relays them);
    the polls that saw no new step were dropped, so 4 steps in 3 s read as 4 steps in 1 s."""
    meter = ThroughputMeter()
    for t, step in enumerate([0, 0, 0, 4, 4, 4, 8]):
        meter.observe_step("t", "t-0", step, float(t), 2)
    assert meter.by_size("t") == {2: pytest.approx(8 / 6)}


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
    assert s.samples_per_s is None  # the drain rate not measured yet
    assert backlog_sample("rollouts", 9, 2.0, "rollout", drain_per_actor=4.5).samples_per_s == 4.5


def test_statistics_reach_the_status_and_dlu_status_shows_them() -> None:
    from dlu_api.cli.render import status_text
    from dlu_api.status import ActorStatus, JobStage, JobStatus, RoleStatus
    from dlu_prime.brain_port import StatSample
    from dlu_prime.stats import with_statistics

    meter = ThroughputMeter()
    for t in range(3):
        meter.observe_step("trainer", "trainer-0", step=t * 3, now=float(t), world_size=2)
        meter.observe_samples("trainer", count=96, now=float(t), world_size=2)
    actor = ActorStatus(name="trainer-0", role="trainer", rank=0, stage="RUNNING")
    status = JobStatus(
        name="lm", stage=JobStage.RUNNING, roles=[RoleStatus(name="trainer", kind="elastic", actors=[actor])]
    )
    usage = {"trainer-0": StatSample(time=1.0, kind="resource", cpu_percent=180.0, memory_bytes=512 * 2**20)}
    shown = status_text(with_statistics(status, meter, usage, {"rollouts": 42}))
    assert "statistics:" in shown
    assert "  trainer speed by size: 2: 96.0 samples/s, 3.00 steps/s" in shown
    assert "  trainer-0: cpu 180%, mem 512 MiB" in shown
    assert "  backlog: rollouts 42" in shown
    assert "statistics:" not in status_text(status)  # nothing measured: nothing shown
