"""The simulated cluster of the scale benchmark drives a real PrimeManager to RUNNING, stays
healthy under monitoring, and shows a killed actor to the monitoring policy."""

from __future__ import annotations

import pytest

from dlu_api.spec import spec_from_dict
from dlu_api.spec.models import JobSpec
from dlu_api.status import JobStage
from dlu_api.vocabulary import ActorStage
from dlu_prime.master.manager import PrimeManager, new_state
from dlu_prime.master.monitor import assess, track_beats, track_steps
from dlu_prime.state.memory import MemoryStateStore
from dlu_prime.testing.sim_scheduler import SimScheduler, node_of

pytestmark = pytest.mark.timeout(30)


class Clock:
    now = 5_000.0

    def __call__(self) -> float:
        return self.now


def spec(total: int = 16, per_group: int = 8) -> JobSpec:
    return spec_from_dict(
        {
            "name": "sim",
            "device_type": "CPU",
            "device_per_node": 0,
            "roles": [{"name": "worker", "entrypoint": "pkg.w:main", "total": total, "per_group": per_group}],
            "health": {"heartbeat_timeout_s": 30},
        }
    )


def running(total: int = 16) -> tuple[PrimeManager, SimScheduler, Clock]:
    job = spec(total)
    clock = Clock()
    sim = SimScheduler(job, clock, new_state(job).actors)
    manager = PrimeManager.create(job, sim, MemoryStateStore(), clock=clock)
    manager.prepare()
    manager.start()
    return manager, sim, clock


def test_actors_sit_per_group_on_a_node_and_reach_running() -> None:
    manager, sim, _ = running(16)
    assert manager.state.stage is JobStage.RUNNING
    nodes = {record.node_id for record in manager.state.actors.values()}
    assert nodes == {node_of(0), node_of(1)}
    assert all(stage is ActorStage.RUNNING for stage in sim.stages.values())


def test_healthy_passes_change_nothing_and_a_killed_actor_is_seen_dead() -> None:
    manager, sim, clock = running(16)
    for _ in range(3):
        clock.now += 1.0
        sim.beat()
        result = manager.monitor_once()
        assert not result.failures and manager.state.stage is JobStage.RUNNING
    victim = "sim.worker.5"
    sim.kill(victim)
    observations = sim.observations()
    result = assess(manager.state, observations, clock.now, track_steps({}, observations, clock.now))
    assert [(f.actor, f.kind) for f in result.failures] == [(victim, "died")]


def test_a_stale_heartbeat_is_a_timeout() -> None:
    manager, sim, clock = running(8)
    sim.beat()
    names = list(manager.state.actors)
    beats = track_beats({}, sim.poll(names), clock.now)
    clock.now += 31.0  # no beat since: every actor is past the 30 s timeout
    result = assess(manager.state, sim.poll(names), clock.now, beats_seen=beats)
    assert {f.kind for f in result.failures} == {"heartbeat_timeout"}
    assert len(result.failures) == 8
