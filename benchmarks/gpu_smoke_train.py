"""The training script of gpu_smoke.py: a torchrun-style NCCL all-reduce loop on one GPU per rank.

Its first lines record what the forked training process was given before it touched CUDA
(CUDA_VISIBLE_DEVICES, LOCAL_RANK, DLU_DEVICE, torch's bad-fork flag); then it takes the device
DLU names (`current_worker().device`), sets up NCCL from torchrun's environment and all-reduces
rank+1 every step, checking the sum. Rank `--crash-rank` raises at `--crash-at-step` of the first
attempt only (TORCHELASTIC_RESTART_COUNT 0), so DLU restarts the ranks in place once.

Writes `start-rank{R}-attempt{A}.json` when CUDA is up and `done-rank{R}-attempt{A}.json` at the
end, in `--out`.
"""

import os  # the first line: the environment exactly as the forked training process got it

SEEN = dict(os.environ)

import sys  # noqa: E402

PRELOADED = "torch" in sys.modules

import argparse  # noqa: E402
import json  # noqa: E402
import signal  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

BAD_FORK = torch.cuda._is_in_bad_fork()  # a flag read: no CUDA call  # pyright: ignore[reportPrivateUsage]
CUDA_INITIALIZED = torch.cuda.is_initialized()

from dlu_prime.runtime import current_worker, heartbeat  # noqa: E402

ENV_NAMES = ("CUDA_VISIBLE_DEVICES", "LOCAL_RANK", "RANK", "WORLD_SIZE", "DLU_DEVICE", "DLU_DEVICES")


def write(out: Path, name: str, data: dict[str, Any]) -> None:
    tmp = out / f"{name}.tmp"
    tmp.write_text(json.dumps(data), encoding="utf-8")
    tmp.replace(out / name)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--step-seconds", type=float, default=0.2)
    parser.add_argument("--crash-at-step", type=int, default=3)
    parser.add_argument("--crash-rank", type=int, default=1)
    parser.add_argument(
        "--hold-fraction", type=float, default=0.0, help="hold this share of the GPU's memory while training"
    )
    parser.add_argument(
        "--linger-on-term",
        type=float,
        default=0.0,
        help="on SIGTERM, exit only after this long (memory held)",
    )
    args = parser.parse_args()
    if args.linger_on_term > 0:
        linger = args.linger_on_term
        signal.signal(signal.SIGTERM, lambda *_: (time.sleep(linger), os._exit(143)))
    out = Path(args.out)
    rank = int(os.environ["RANK"])
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    tag = f"rank{rank}-attempt{attempt}"

    device = torch.device(current_worker().device)
    torch.cuda.set_device(device)
    props = torch.cuda.get_device_properties(device)
    held = torch.empty(int(props.total_memory * args.hold_fraction), dtype=torch.uint8, device=device)
    write(
        out,
        f"start-{tag}.json",
        {
            "rank": rank,
            "attempt": attempt,
            "env": {name: SEEN.get(name) for name in ENV_NAMES},
            "torch_preloaded": PRELOADED,
            "bad_fork_at_start": BAD_FORK,
            "cuda_initialized_at_start": CUDA_INITIALIZED,
            "device": str(device),
            "device_count": torch.cuda.device_count(),
            "gpu_uuid": str(props.uuid),
            "gpu_name": props.name,
            "held_bytes": held.numel(),
        },
    )

    dist.init_process_group("nccl")
    world = dist.get_world_size()
    expected = world * (world + 1) / 2
    sums: list[float] = []
    for step in range(1, args.steps + 1):
        value = torch.full((1 << 20,), float(rank + 1), device=device)
        dist.all_reduce(value)
        if not bool(value.eq(expected).all()):
            raise RuntimeError(f"step {step}: all-reduce gave {value[:4].tolist()}..., expected {expected}")
        sums.append(float(value[0].item()))
        heartbeat(step, sums[-1])
        if attempt == 0 and rank == args.crash_rank and step == args.crash_at_step:
            (out / "crashed").write_text(f"rank {rank} step {step}\n", encoding="utf-8")
            raise RuntimeError(f"injected crash of rank {rank} at step {step}")
        time.sleep(args.step_seconds)
    write(
        out,
        f"done-{tag}.json",
        {"rank": rank, "attempt": attempt, "backend": dist.get_backend(), "world_size": world, "sums": sums},
    )
    dist.destroy_process_group()
    print(f"gpu smoke rank {rank} attempt {attempt}: {len(sums)} all-reduces on {device} ok", flush=True)


if __name__ == "__main__":
    main()
