"""Entrypoints the integration tests run inside real worker actors (imported by module name)."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

from dlu_prime.runtime import current_worker, heartbeat, rpc
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


class SlowToStop:
    """Runs until killed and answers a stop request only after minutes: a clean stop of its job
    waits out the PrimeMaster's stop timeout (what a second Ctrl-C does not wait for)."""

    def run(self) -> None:
        forever()

    def stop(self) -> None:
        time.sleep(600)


def silent_service() -> None:
    """A service that works without ever calling heartbeat(): judged by its poll answers only."""
    while True:
        time.sleep(0.5)


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


def report_and_wait() -> None:
    from dlu_prime.runtime import report_error

    report_error("disk quota exceeded on the test worker")
    time.sleep(30)


class Looper:
    """A class entrypoint with a run() main loop and @rpc methods other roles call."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def run(self) -> None:
        heartbeat(1)

    @rpc
    def echo(self, value: object, suffix: str = "") -> str:
        return f"{current_worker().rank}:{value}{suffix}"


def call_loopers() -> None:
    """Role groups: all ranks, rank 0, futures, and batched scatter with args and kwargs."""
    from dlu_prime.runtime import role_group

    group = role_group("looper")
    assert group.call("echo", "x") == ["0:x", "1:x"]
    assert group.rank0("echo", "y", suffix="!") == "0:y!"
    future = group.call_async("echo", "z")
    assert future.result(timeout=30) == ["0:z", "1:z"]
    assert future.done()
    assert group.scatter("echo", ["a", "b"], suffix=["1", "2"]) == ["0:a1", "1:b2"]


def shard_worker() -> None:
    """Dynamic sharding through the SDK: every record is processed exactly once."""
    from dlu_prime.runtime import consumer_id, shard_queue

    worker = current_worker()
    queue = shard_queue("data", dataset_size=100, shard_size=7)
    me = consumer_id()
    out = Path(worker.config["out_dir"])
    while not queue.finished():
        shard = queue.next_shard(me)
        if shard is None:
            time.sleep(0.05)
            continue
        for record in range(shard.start, shard.end):
            (out / f"{record}.{me}").touch()
        assert queue.complete(me, shard.id)


def steps_with_progress() -> None:
    worker = current_worker()
    for step in range(int(worker.config.get("steps", 40))):
        time.sleep(0.1)
        heartbeat(step)


class PolicyShard:
    """An elastic RL role as a class: its ranks share a process group; the trainer calls it."""

    @rpc
    def train_step(self, value: float) -> float:
        import torch
        import torch.distributed as dist

        tensor = torch.tensor([value])
        dist.all_reduce(tensor)
        return float(tensor.item())

    @rpc
    def world(self) -> tuple[int, int]:
        import torch.distributed as dist

        return dist.get_rank(), dist.get_world_size()


def drive_policy() -> None:
    from dlu_prime.runtime import role_group

    policy = role_group("policy")
    assert sorted(policy.call("world", timeout=120)) == [(0, 2), (1, 2)]
    assert policy.scatter("train_step", [1.0, 2.0], timeout=120) == [3.0, 3.0]


def print_rank() -> None:
    """A simple role's rank printing on stdout, stderr and from a child process."""
    import subprocess

    rank = os.environ.get("ROLE_RANK", "?")
    print(f"simple-stdout rank {rank}", flush=True)
    print(f"simple-stderr rank {rank}", file=sys.stderr, flush=True)
    subprocess.run(["echo", f"simple-child rank {rank}"], check=True)


def print_forever() -> None:
    """A simple role's rank printing a numbered line every 0.1 s until stopped."""
    rank = os.environ.get("ROLE_RANK", "?")
    count = 0
    while True:
        print(f"tick {count} of rank {rank}", flush=True)
        count += 1
        time.sleep(0.1)


def wait_for_go() -> None:
    """Beat until the file named by config `go` exists: a driver that ends when the test says."""
    go = Path(current_worker().config["go"])
    step = 0
    while not go.exists():
        step += 1
        heartbeat(step)
        time.sleep(0.05)


def read_configured_channel() -> None:
    """Reads the channel `config["inputs"][<this role>]` until it closes. The name comes from
    the config, so the static channel check cannot see that nobody writes it: the stall notice
    must."""
    from dlu_prime.runtime import channel, consumer_id

    worker = current_worker()
    inputs = channel(worker.config["inputs"][worker.role])
    for _ in inputs.iterate(consumer_id()):
        pass


def die_hard() -> None:
    """The worker's process is killed outright mid-task (as by the OOM killer): Ray's raylet
    reports "A worker died or was killed while executing a task" to the driver."""
    import signal

    time.sleep(1.0)
    os.kill(os.getpid(), signal.SIGKILL)
