"""The smallest DLU job: a few workers that each do some steps and report heartbeats."""

from __future__ import annotations

import time

from dlu_prime.runtime import current_worker, heartbeat


def main() -> None:
    worker = current_worker()
    steps = int(worker.config.get("steps", 5))
    for step in range(steps):
        time.sleep(float(worker.config.get("step_seconds", 0.05)))
        heartbeat(step)
    print(f"{worker.actor_name}: rank {worker.rank}/{worker.world_size} did {steps} steps", flush=True)
