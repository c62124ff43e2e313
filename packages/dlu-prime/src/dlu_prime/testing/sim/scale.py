"""One job at scale: the decision time of a monitoring pass with every actor healthy and a
few faults, on the same simulated cluster (its cost is the manager's, not the simulation's)."""

from __future__ import annotations

import logging
import time

from dlu_api.spec import spec_from_dict
from dlu_prime.master.lifecycle import sub_masters
from dlu_prime.master.manager import PrimeManager
from dlu_prime.naming import sub_master_name
from dlu_prime.state.memory import MemoryStateStore
from dlu_prime.testing.sim.clock import SimClock
from dlu_prime.testing.sim.cluster import SimCluster
from dlu_prime.testing.sim.crash import CrashPoint


def pass_times(nodes: int = 2048, ranks: int = 8, passes: int = 60) -> list[float]:
    logging.disable(logging.CRITICAL)
    spec = spec_from_dict(
        {
            "name": "scale",
            "device_type": "CPU",
            "device_per_node": 0,
            "roles": [  # a role holds at most 10,000 actors: the nodes are split over two roles
                {
                    "name": f"train{part}",
                    "kind": "elastic",
                    "entrypoint": "pkg.train:main",
                    "elastic": {
                        "nnodes": nodes // 2,
                        "nproc_per_node": ranks,
                        "node_check": {"enabled": False},
                    },
                }
                for part in (0, 1)
            ],
            "health": {"monitor_interval_s": 1.0},
        }
    )
    clock = SimClock()
    subs = {sub_master_name("scale", f"train{part}"): f"train{part}" for part in (0, 1)}
    cluster = SimCluster(spec, clock, CrashPoint(), subs)
    manager = PrimeManager.create(spec, cluster, MemoryStateStore(), clock)
    cluster.restart_actors = manager.recovery.restart_actors
    manager.prepare()
    manager.start()
    assert sub_masters(manager.state)
    times: list[float] = []
    workers = [n for n in manager.state.actors if not n.endswith("submaster")]
    for i in range(passes):
        clock.advance(1.0)
        cluster.beat()
        if i % 20 == 10:  # a fault now and then: the pass that judges it and runs its failover
            cluster.kill_actor(workers[i * 7 % len(workers)])
        started = time.perf_counter()
        manager.monitor_once()
        times.append(time.perf_counter() - started)
    return times
