"""Where a dead named actor last ran, read back from Ray's own record of it
(dlu_prime.ray_private.dead_actor_nodes): a rebuilt PrimeMaster tells a replacement its
predecessor placed and lost from the death its saved failover began for."""

from __future__ import annotations

import time
from typing import Any

import pytest

pytestmark = [pytest.mark.ray, pytest.mark.timeout(120)]


def test_a_dead_actor_is_found_on_the_node_it_ran_on_and_a_live_one_is_not(ray_session: Any) -> None:
    import ray

    from dlu_prime import ray_private
    from dlu_prime.naming import NAMESPACE

    class Where:  # defined here: Ray ships it by value
        def node(self) -> str:
            return ray.get_runtime_context().get_node_id()

    make: Any = ray.remote(num_cpus=0, max_restarts=0)(Where)
    doomed = make.options(name="deadnodes.role.0", namespace=NAMESPACE).remote()
    alive = make.options(name="deadnodes.role.1", namespace=NAMESPACE).remote()
    node = ray.get(doomed.node.remote(), timeout=60)
    ray.get(alive.node.remote(), timeout=60)
    names = ["deadnodes.role.0", "deadnodes.role.1", "deadnodes.never"]
    assert ray_private.dead_actor_nodes(names) == {}
    ray.kill(doomed, no_restart=True)
    deadline = time.monotonic() + 60
    found: dict[str, str] = {}
    while not found and time.monotonic() < deadline:  # the GCS records the death asynchronously
        found = ray_private.dead_actor_nodes(names)
        time.sleep(0.1)
    assert found == {"deadnodes.role.0": node}
    ray.kill(alive, no_restart=True)
