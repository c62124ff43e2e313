"""Flash checkpoints (dlu_elastic.checkpoint): what a save blocks, what a restore costs.

For each state size per rank (default 256 MiB and 1 GiB of float32, in 64 MiB tensors), in one
process on this machine: the blocking time of `save` (median of steady saves, the slots' pages
already reserved by a first save) and its ratio to a plain memory copy of the same bytes into
an already-touched buffer, measured in the same run (goal <= 1.5x); `torch.save` to local disk
and `torch.distributed.checkpoint.async_save`'s blocking time on the same state; restore time
from memory (`load()` after a new process view), from a replica (the background copy of both
slots to a buddy agent's folder, timed, then `load()` with the own slots gone: in one process
the replica is read from the folder, the network hop between nodes is not in it) and from disk
(the agent's persisted copy).
Then, unless --no-job, the reference job (examples/elastic/train_lm.py, flash save every step)
under DLU on a local Ray, crashed at a random step: the steps it lost (goal 0).
Usage: `uv run python benchmarks/flash_checkpoint.py [--sizes-mib 256 1024] [--no-job]`.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from figures import figure

from dlu_elastic.checkpoint import FlashCheckpointer, replica, shm
from dlu_elastic.checkpoint.persist import Persister

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
CHUNK = 64 << 20


def make_state(mib: int) -> dict[str, Any]:
    total = mib << 20
    tensors = {
        f"t{i}": torch.randn(min(CHUNK, total - i * CHUNK) // 4) for i in range((total + CHUNK - 1) // CHUNK)
    }
    return {"model": tensors, "meta": {"step": 0}}


def timed(call: Any, runs: int) -> float:
    times = []
    for _ in range(runs):
        began = time.perf_counter()
        call()
        times.append(time.perf_counter() - began)
    return statistics.median(times)


def plain_copy(state: dict[str, Any]) -> Any:
    """A copy of the same bytes into buffers already touched (what a save cannot beat)."""
    targets = {k: torch.empty_like(v) for k, v in state["model"].items()}
    for k, v in state["model"].items():
        targets[k].copy_(v)  # touch the pages once

    def copy() -> None:
        for k, v in state["model"].items():
            targets[k].copy_(v)

    return copy


def dcp_async_blocking(state: dict[str, Any], where: Path) -> str:
    try:
        from torch.distributed.checkpoint.state_dict_saver import async_save

        began = time.perf_counter()
        future: Any = async_save(state["model"], checkpoint_id=str(where))
        blocked = time.perf_counter() - began
        future.result()
        return f"{blocked:.3f} s"
    except Exception as exc:  # not every setup runs it without a process group
        return f"n/a ({type(exc).__name__}: {str(exc).splitlines()[0][:80]})"


def measure(mib: int, runs: int) -> tuple[float, float]:
    state = make_state(mib)
    folder = shm.create("bench", f"flash-{mib}")
    disk_dir = Path(tempfile.mkdtemp(prefix="dlu-flash-bench-"))
    try:
        ckpt = FlashCheckpointer(folder, persist_dir=str(disk_dir / "durable"))
        first = time.perf_counter()
        ckpt.save(1, state)
        first_s = time.perf_counter() - first
        ckpt.save(2, state)  # both slots' pages are now reserved
        step = iter(range(3, 10_000))
        copy = plain_copy(state)
        saves: list[float] = []
        copies: list[float] = []
        for _ in range(runs):  # alternated, so both see the same moment of a shared machine
            saves.append(timed(lambda: ckpt.save(next(step), state), 1))
            copies.append(timed(copy, 1))
        save_s, copy_s = statistics.median(saves), statistics.median(copies)
        ratio = save_s / copy_s
        torch_save_s = timed(lambda: torch.save(state, disk_dir / "state.pt"), 1)
        dcp = dcp_async_blocking(state, disk_dir / "dcp")
        load_s = timed(lambda: FlashCheckpointer(folder).load(), 1)
        persister = Persister(folder, disk_dir / "durable", every=1, on_event=lambda k, m: None)
        persister.tick()
        empty = shm.create("bench", f"flash-{mib}-empty")
        disk_load_s = timed(lambda: FlashCheckpointer(empty, persist_dir=str(disk_dir / "durable")).load(), 1)
        shm.remove(empty)
        replica_copy_s, replica_load_s = replica_restore(folder, mib)
        print(
            f"{mib} MiB per rank: save blocks {save_s:.3f} s (first save, reserving pages: {first_s:.3f} s), "
            f"plain copy {copy_s:.3f} s, ratio {ratio:.2f}x; torch.save to disk {torch_save_s:.3f} s; "
            f"DCP async_save blocks {dcp}; restore from memory {load_s:.3f} s, from disk {disk_load_s:.3f} s, "
            f"from a replica {replica_load_s:.3f} s (background copy of both slots to the buddy "
            f"{replica_copy_s:.3f} s)",
            flush=True,
        )
        return ratio, load_s
    finally:
        shm.remove(folder)
        shutil.rmtree(disk_dir, ignore_errors=True)


def replica_restore(folder: Path, mib: int) -> tuple[float, float]:
    """(the background copy of both slots into a buddy folder, load() from that replica)."""
    buddy = shm.create("bench", f"flash-{mib}-buddy")
    try:

        def keep(slot: int, data: bytes | None) -> None:
            if data is None:
                replica.discard(buddy, 0, slot)
            else:
                replica.store(buddy, slot, data)

        copy_s = timed(lambda: replica.Replicator(folder, 0, keep, lambda k, m: None).tick(), 1)
        return copy_s, timed(lambda: FlashCheckpointer(buddy).load(), 1)
    finally:
        shm.remove(buddy)


def job_lost_steps(seed: int) -> int | None:
    """The reference job, flash save every step, crashed once at a random step: steps lost."""
    os.environ["RAY_ENABLE_UV_RUN_RUNTIME_ENV"] = "0"  # the workers use this venv as it is
    import ray

    from dlu_api.spec import load_spec
    from dlu_prime import launcher
    from dlu_prime.ray_env import pin_loopback

    crash = random.Random(seed).randint(3, 17)
    out = Path(tempfile.mkdtemp(prefix="dlu-flash-job-"))
    tmp_root = tempfile.mkdtemp(prefix="dlu-ray-", dir="/tmp")
    os.environ["RAY_TMPDIR"] = tmp_root
    try:
        with pin_loopback():
            ray.init(
                address="local",
                namespace="dlu",
                include_dashboard=False,
                num_cpus=8,
                _node_ip_address="127.0.0.1",
                _temp_dir=tmp_root,
            )
        data = load_spec(ROOT / "examples/elastic/job.yaml").model_dump(mode="json")
        data["name"] = "flash-bench"
        data["roles"][0]["elastic"]["node_check"] = {"enabled": False}
        data["roles"][0]["entrypoint"] = (
            f"examples/elastic/train_lm.py --steps 20 --checkpoint-dir {out} --crash-at-step {crash} --crash-rank 1"
        )
        from dlu_api.spec import spec_from_dict

        status = launcher.run_job(spec_from_dict(data), str(ROOT))
        restored = [e.message for e in status.events if e.kind == "checkpoint_restored"]
        print(f"reference job crashed at step {crash}: exit {status.exit_code}; {restored}", flush=True)
        if status.exit_code != 0 or not restored:
            return None
        return int(restored[-1].rsplit(":", 1)[1])
    finally:
        ray.shutdown()
        shutil.rmtree(tmp_root, ignore_errors=True)
        shutil.rmtree(out, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--sizes-mib", type=int, nargs="*", default=[256, 1024])
    parser.add_argument("--runs", type=int, default=5, help="saves and copies timed per size (median)")
    parser.add_argument("--no-job", action="store_true", help="leave out the reference job (it starts Ray)")
    parser.add_argument("--seed", type=int, default=None, help="the crash step's seed (default: random)")
    args = parser.parse_args()
    torch.set_num_threads(max(1, os.cpu_count() or 1))
    results = {mib: measure(mib, args.runs) for mib in args.sizes_mib}
    lost = (
        None
        if args.no_job
        else job_lost_steps(args.seed if args.seed is not None else random.randrange(1 << 30))
    )
    for mib, (ratio, load_s) in results.items():
        figure(f"flash_save_ratio_{mib}mib", ratio, "x", 1.5, f"flash save / plain copy, {mib} MiB per rank")
        figure(f"flash_restore_memory_{mib}mib", load_s, "s", None, f"flash restore from memory, {mib} MiB")
    if lost is not None:
        figure(
            "flash_lost_steps",
            lost,
            "steps",
            0.0,
            "steps lost, reference job saving every step, random crash",
        )


if __name__ == "__main__":
    main()
