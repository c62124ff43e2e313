"""One job at scale: the decision time of a monitoring pass with every actor healthy and a
few faults, on the same simulated cluster (its cost is the manager's, not the simulation's)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from dlu_api.spec import spec_from_dict
from dlu_api.spec.models import JobSpec
from dlu_prime.master.manager import PrimeManager
from dlu_prime.naming import sub_master_name
from dlu_prime.state.memory import MemoryStateStore
from dlu_prime.testing.sim.clock import SimClock
from dlu_prime.testing.sim.cluster import SimCluster
from dlu_prime.testing.sim.crash import CrashPoint


def scale_spec(nodes: int, ranks: int) -> JobSpec:
    """One elastic role of `nodes` x `ranks`. A spec holds at most 10,000 actors (a larger one
    is refused as a typo), so the validated one-node spec is grown to `nodes` afterwards."""
    spec = spec_from_dict(
        {
            "name": "scale",
            "device_type": "CPU",
            "device_per_node": 0,
            "roles": [
                {
                    "name": "train",
                    "kind": "elastic",
                    "entrypoint": "pkg.train:main",
                    "elastic": {"nnodes": 1, "nproc_per_node": ranks, "node_check": {"enabled": False}},
                }
            ],
            "health": {"monitor_interval_s": 1.0},
        }
    )
    role = spec.roles[0]
    assert role.elastic is not None
    grown = role.model_copy(
        update={"total": nodes * ranks, "elastic": role.elastic.model_copy(update={"nnodes": str(nodes)})}
    )
    return spec.model_copy(update={"roles": [grown]})


class _IoTimer:
    """Time spent in I/O inside a pass, exclusive: the store's writes and the (simulated)
    cluster's calls, less what a call hands back to the manager meanwhile (a SubMaster's
    `failover` asks the PrimeMaster to replace actors: decisions again)."""

    def __init__(self, clock_of: Callable[[], float]) -> None:
        self.clock_of = clock_of
        self.spent = 0.0
        self._inside = False

    def io(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        def timed(*args: Any, **kwargs: Any) -> Any:
            if self._inside:
                return fn(*args, **kwargs)
            self._inside, started = True, self.clock_of()
            try:
                return fn(*args, **kwargs)
            finally:
                self.spent += self.clock_of() - started
                self._inside = False

        return timed

    def decision(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        def timed(*args: Any, **kwargs: Any) -> Any:
            if not self._inside:
                return fn(*args, **kwargs)
            self._inside, started = False, self.clock_of()
            try:
                return fn(*args, **kwargs)
            finally:
                self.spent -= self.clock_of() - started
                self._inside = True

        return timed


IO_METHODS = ("poll", "restart", "start", "call", "setup", "stop", "dead_nodes", "check_children")


def pass_times(
    nodes: int = 2048, ranks: int = 8, passes: int = 60, cpu: bool = False, decision: bool = False
) -> list[float]:
    """Seconds of each monitoring pass (poll, judge, apply, recover) of one running job: wall
    time, or with `cpu` this process's CPU time (what a loaded machine does not inflate). With
    `decision`, the decision time of each: the pass less its I/O (the store's writes, the
    cluster's calls, `_IoTimer`), which the decisions order but do not include."""
    clock_of = time.process_time if cpu else time.perf_counter
    before = logging.root.manager.disable
    logging.disable(logging.CRITICAL)
    try:
        spec = scale_spec(nodes, ranks)
        clock = SimClock()
        cluster = SimCluster(spec, clock, CrashPoint(), {sub_master_name("scale", "train"): "train"})
        manager = PrimeManager.create(spec, cluster, MemoryStateStore(), clock)
        cluster.restart_actors = manager.restart_actors
        manager.prepare()
        manager.start()
        timer = _IoTimer(clock_of)
        if decision:
            for method in IO_METHODS:
                setattr(cluster, method, timer.io(getattr(cluster, method)))
            manager.writer.save = timer.io(manager.writer.save)
            cluster.restart_actors = timer.decision(manager.restart_actors)
        workers = [n for n in manager.state.actors if not n.endswith("submaster")]
        times: list[float] = []
        for i in range(passes):
            clock.advance(1.0)
            cluster.beat()
            if i % 20 == 10:  # a fault now and then: the pass that judges it and runs its failover
                cluster.kill_actor(workers[i * 7 % len(workers)])
            timer.spent = 0.0
            started = clock_of()
            manager.monitor_once()
            times.append(clock_of() - started - timer.spent)
        return times
    finally:
        logging.disable(before)
