"""Where a relaunched elastic rank lands, on a three-node `ray.cluster_utils.Cluster` (separate
raylets on this machine, so Ray really picks a node): the rank's own group of its new memory
goes to the node its old incarnation ran on while that node has room, and, once it has none,
to a node holding no other node rank of its role. The RayScheduler runs against the cluster
with a small stand-in worker class (it says its node; nothing trains)."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from short_tmp import short_tmp_dir

pytestmark = [pytest.mark.ray, pytest.mark.timeout(120)]

GiB = 2**30


class NodeSayer:
    """A worker that answers the scheduler's lifecycle calls with its node and no GPUs."""

    def __init__(self, info: Any) -> None:
        self.info = info
        self.incarnation = uuid.uuid4().hex  # another one for every actor Ray creates

    def token(self) -> str:
        return self.incarnation

    def identity(self) -> dict[str, Any]:
        import ray

        return {"node_id": ray.get_runtime_context().get_node_id(), "gpu_ids": [], "reconstructed": False}

    def status(self) -> dict[str, Any]:
        return {"stage": "READY", "reconstructed": False}

    def setup(self, env: dict[str, str] | None = None) -> dict[str, Any]:
        return self.identity()

    def stop(self) -> None:
        return None


@contextlib.contextmanager
def _cluster() -> Iterator[Any]:
    import ray
    from ray import cloudpickle
    from ray.cluster_utils import Cluster

    from dlu_prime.naming import NAMESPACE
    from dlu_prime.ray_env import pin_loopback

    old = os.environ.get("RAY_TMPDIR")
    os.environ["RAY_TMPDIR"] = short_tmp_dir("dlu-pin-")
    cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the workers cannot import tests/
    assert not ray.is_initialized()  # a process of its own: the driver joins this cluster alone
    args = {"num_cpus": 2, "memory": 4 * GiB, "node_ip_address": "127.0.0.1"}
    with pin_loopback():
        found = Cluster(
            initialize_head=True,
            head_node_args={"num_cpus": 0, "include_dashboard": False, "node_ip_address": "127.0.0.1"},
        )
        for _ in range(3):
            found.add_node(**args)
        ray.init(address=found.address, namespace=NAMESPACE)
    found.wait_for_nodes()
    try:
        yield found
    finally:
        ray.shutdown()
        found.shutdown()
        if old is None:
            os.environ.pop("RAY_TMPDIR", None)
        else:
            os.environ["RAY_TMPDIR"] = old


def _bundle_node(pg_name: str) -> str:
    from ray.util import get_placement_group, placement_group_table

    return placement_group_table(get_placement_group(pg_name))["bundles_to_node_id"][0]


def test_a_relaunched_rank_goes_back_to_its_node_else_to_one_without_its_roles_other_ranks() -> None:
    """Run in a process of its own (`main`): the session's Ray of the other modules may be up in
    this one, and a driver joins one Ray at a time."""
    tests = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tests), str(tests / "integration")])}
    done = subprocess.run(
        [sys.executable, __file__], env=env, capture_output=True, text=True, timeout=110, check=False
    )
    print(done.stdout[-3000:])
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-6000:]
    assert "checked" in done.stdout


def main() -> None:
    with _cluster():
        _check()
    print("checked: back to its node, then to the node without its role's other rank")


def _check() -> None:
    import ray
    from ray.util.placement_group import placement_group, remove_placement_group

    from dlu_api.spec import spec_from_dict
    from dlu_prime.scheduler.node_pinning import NODE_ID_LABEL
    from dlu_prime.scheduler.ray_scheduler import RayScheduler

    spec = spec_from_dict(
        {
            "name": "pin",
            "device_type": "CPU",
            "device_per_node": 0,
            "roles": [
                {
                    "name": "train",
                    "kind": "elastic",
                    "entrypoint": "m:f",
                    "elastic": {"nnodes": "1:2"},
                    "resources": {"cpu": 0.5, "memory": "1GiB"},
                }
            ],
        }
    )
    scheduler = RayScheduler(spec, actor_class_for=lambda role: NodeSayer, placement_timeout_s=30.0)
    blocker = None
    before = ray.available_resources().get("memory", 0.0)
    try:
        nodes = scheduler.prepare()
        home0, home1 = nodes["pin.train.0"], nodes["pin.train.1"]
        first_rank0 = scheduler.call("pin.train.0", "token")
        assert home0 and home1 and home0 != home1, nodes  # a node group each, on two Ray nodes
        workers = [n["NodeID"] for n in ray.nodes() if n["Alive"] and n["Resources"].get("CPU", 0) > 0]
        (third,) = set(workers) - {home0, home1}  # the head (no CPU) holds no bundle of the job
        # rank 1 relaunched with 1.5 GiB: its old node has room (4 GiB less its node group's 1 GiB)
        scheduler.set_memory({"pin.train.1": 3 * GiB // 2})
        again = scheduler.restart(["pin.train.1"])
        assert again["pin.train.1"] == home1
        assert _bundle_node(f"pin.pg.train.1.mem{3 * GiB // 2}") == home1
        # its old node filled by someone else: 2.25 GiB no longer fits there; rank 0's node could
        # hold it (3 GiB free) but holds another node rank of the role: the third node it is
        blocker = placement_group([{"memory": 1.5 * GiB}], bundle_label_selector=[{NODE_ID_LABEL: home1}])
        ray.get(blocker.ready(), timeout=30)
        scheduler.set_memory({"pin.train.1": 9 * GiB // 4})
        moved = scheduler.restart(["pin.train.1"])
        assert moved["pin.train.1"] == third, (moved, home0, home1, third)
        assert _bundle_node(f"pin.pg.train.1.mem{9 * GiB // 4}") == third
        assert scheduler.call("pin.train.0", "token") == first_rank0  # the healthy rank was never replaced
    finally:
        if blocker is not None:
            remove_placement_group(blocker)
        scheduler.cleanup()
    deadline = time.monotonic() + 30  # Ray's count of free resources lags a removal
    while ray.available_resources().get("memory", 0.0) < before and time.monotonic() < deadline:
        time.sleep(0.2)
    assert ray.available_resources().get("memory", 0.0) >= before  # nothing of the job is left reserved


if __name__ == "__main__":
    main()
