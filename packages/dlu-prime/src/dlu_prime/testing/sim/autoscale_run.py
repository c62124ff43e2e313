"""Auto-scaled jobs on the simulated cluster, step by step on a simulated clock: what the tests
and `benchmarks/autoscale.py` run. A run is a pure function of its arguments."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from dlu_api.spec import spec_from_dict
from dlu_api.spec.models import JobSpec
from dlu_api.status import JobStage
from dlu_api.vocabulary import EventKind
from dlu_prime.brain_port import BrainPort
from dlu_prime.naming import sub_master_name
from dlu_prime.state.memory import MemoryStateStore
from dlu_prime.testing.sim import adapter
from dlu_prime.testing.sim.clock import SimClock
from dlu_prime.testing.sim.cluster import SimCluster
from dlu_prime.testing.sim.crash import CrashPoint
from dlu_prime.testing.sim.workloads import BurstyQueue, ElasticSteps

ELASTIC = "train"
WORKERS = "prep"


def elastic_spec(
    low: int,
    high: int,
    *,
    mode: str = "single-job",
    threshold: float | None = None,
    settle_s: float = 5.0,
    measure_s: float = 20.0,
    name: str = "autoscale",
    brain_url: str | None = None,
    memory: str | None = None,
) -> JobSpec:
    autoscale: dict[str, Any] = {"mode": mode, "settle_s": settle_s, "measure_s": measure_s}
    if threshold is not None:  # else the spec's default
        autoscale["marginal_threshold"] = threshold
    if brain_url is not None:
        autoscale["brain_url"] = brain_url
    return spec_from_dict(
        {
            "name": name,
            "device_type": "CPU",
            "device_per_node": 0,
            "roles": [
                {
                    "name": ELASTIC,
                    "kind": "elastic",
                    "entrypoint": "pkg.train:main",
                    "resizable": True,
                    **({"resources": {"memory": memory}} if memory is not None else {}),
                    "elastic": {
                        "nnodes": f"{low}:{high}",
                        "nproc_per_node": 1,
                        "node_check": {"enabled": False},
                    },
                }
            ],
            "health": {"monitor_interval_s": 1.0, "stall_timeout_s": None},
            "autoscale": autoscale,
        }
    )


def backlog_spec(
    total: int,
    high: int,
    *,
    target_s: float = 30.0,
    settle_s: float = 5.0,
    measure_s: float = 10.0,
    memory: str | None = None,
    mode: str = "single-job",
    name: str = "backlog",
    brain_url: str | None = None,
) -> JobSpec:
    brain = {"brain_url": brain_url} if brain_url is not None else {}
    return spec_from_dict(
        {
            "name": name,
            "device_type": "CPU",
            "device_per_node": 0,
            "roles": [
                {"name": "main", "entrypoint": "pkg.main:main"},
                {
                    "name": WORKERS,
                    "entrypoint": "pkg.prep:main",
                    "total": total,
                    "max_total": high,
                    "resizable": True,
                    "is_driver": False,
                    **({"resources": {"memory": memory}} if memory is not None else {}),
                },
            ],
            "health": {"monitor_interval_s": 1.0, "stall_timeout_s": None},
            "autoscale": {
                "mode": mode,
                "backlog_roles": {WORKERS: "samples"},
                "backlog_target_s": target_s,
                "settle_s": settle_s,
                "measure_s": measure_s,
                **brain,
            },
        }
    )


@dataclass
class Trace:
    sizes: list[tuple[float, int]] = field(default_factory=list[tuple[float, int]])  # (t, size) per step
    decisions: list[tuple[float, str]] = field(default_factory=list[tuple[float, str]])
    backlogs: list[tuple[float, float]] = field(default_factory=list[tuple[float, float]])


class AutoscaleSim:
    """One job on a SimCluster with a simulated clock; `step` is one second of the world and one
    turn of the PrimeManager's loop."""

    def __init__(self, spec: JobSpec, brain: BrainPort | None = None) -> None:
        logging.getLogger("dlu_prime").setLevel(logging.WARNING)
        self.clock = SimClock()
        subs = {sub_master_name(spec.name, r.name): r.name for r in spec.roles if r.kind.value == "elastic"}
        self.cluster = SimCluster(spec, self.clock, CrashPoint(), subs)
        self.manager = adapter.create(spec, self.cluster, MemoryStateStore(), self.clock)
        self.cluster.restart_actors = self.manager.restart_actors
        self.autoscale = self.manager.monitoring.autoscale
        self.autoscale.brain = brain
        self.started = self.clock()
        self.trace = Trace()
        self._seen = 0
        self.queue: BurstyQueue | None = None
        self.steps: ElasticSteps | None = None
        adapter.turn(self.manager, False)  # INIT -> READY -> RUNNING

    def with_queue(self, queue: BurstyQueue) -> AutoscaleSim:
        self.queue = queue
        self.manager.registry.register_channel(queue.name, "channel", queue.record.actor_name)
        self.autoscale.queue_poll = lambda records: (
            {queue.name: queue.view()} if queue.name in records else {}
        )
        return self

    def with_steps(self, steps: ElasticSteps) -> AutoscaleSim:
        self.steps = steps
        return self

    def step(self, dt: float = 1.0) -> None:
        state = self.manager.state
        t = self.clock() - self.started
        if self.steps is not None:
            self.trace.sizes.append((t, self.steps.advance(state, self.cluster, dt)))
        if self.queue is not None:
            self.trace.sizes.append((t, self.queue.advance(state, self.cluster, t, dt)))
            self.trace.backlogs.append((t, self.queue.backlog))
        self.clock.advance(dt)
        adapter.turn(self.manager, False)
        for event in self.manager.state.events:
            if event.seq > self._seen and event.kind == EventKind.AUTOSCALE_DECISION:
                self.trace.decisions.append((event.time - self.started, event.message))
        self._seen = self.manager.state.event_seq

    def run(self, seconds: float, until: Callable[[AutoscaleSim], bool] | None = None) -> Trace:
        end = self.clock() + seconds
        while self.clock() < end and self.manager.state.stage is JobStage.RUNNING:
            self.step()
            if until is not None and until(self):
                break
        return self.trace
