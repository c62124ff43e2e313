"""Entrypoints the integration tests run inside real worker actors (imported by module name)."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from dlu_prime.runtime import current_worker, heartbeat
from dlu_prime.worker.submaster import SubMaster


def quick() -> None:
    heartbeat(1)


def fail() -> None:
    raise RuntimeError("boom from the test workload")


def exit_nonzero() -> None:
    raise SystemExit(3)


def forever() -> None:
    step = 0
    while True:
        time.sleep(0.05)
        step += 1
        heartbeat(step)


def record_env() -> None:
    """Write what the GPU table decides (env and torch-style devices) to a file per actor."""
    worker = current_worker()
    out = Path(worker.config["out_dir"]) / f"{worker.actor_name}.json"
    import ray

    out.write_text(
        json.dumps(
            {
                "role": worker.role,
                "rank": worker.rank,
                "local_rank": os.environ.get("LOCAL_RANK"),
                "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
                "ray_gpu_ids": [str(g) for g in ray.get_gpu_ids()],
                "dlu_devices": os.environ.get("DLU_DEVICES"),
            }
        )
    )


class ReverseStartSubMaster(SubMaster):
    """A custom SubMaster: checks its workers, then starts them from the last rank down."""

    def check_child(self) -> None:
        super().check_child()
        self.checked = True

    def start(self) -> None:
        import ray

        for worker in reversed(self.workers):
            ray.get(worker.start.remote())


class NotASubMaster:
    pass


def record_node() -> None:
    import ray

    worker = current_worker()
    node = ray.get_runtime_context().get_node_id()
    (Path(worker.config["out_dir"]) / f"{worker.actor_name}.node").write_text(node)
    time.sleep(float(worker.config.get("hold_s", 0)))
