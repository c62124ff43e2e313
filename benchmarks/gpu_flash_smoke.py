"""Flash checkpoint of CUDA tensors on one GPU: save, crash, restore, same values.

A child process holds a state on the GPU (float32, bfloat16, int64 and a CPU tensor), changes
it and saves it with dlu_elastic.checkpoint at steps 1 to 4 (the D2H copies run on a side
stream into page-locked shared memory), recording each step's checksum before its save; it
calls `wait()` after steps 1 to 3 and is SIGKILLed right after queuing step 4's save, its
copies possibly in flight. This process then loads: it must get step 3 or 4 (4 only when its
copies had landed) with exactly the checksum recorded for that step. Also prints what save()
blocked (queuing) against the whole copy (save + wait). Where no CUDA device is usable it
prints `SKIPPED: <why>` and exits 0. Usage: `uv run python benchmarks/gpu_flash_smoke.py`.
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from figures import figure

HERE = Path(__file__).resolve().parent


def digest(state: dict[str, Any]) -> str:
    """sha256 of every tensor's bytes (copied to the host), by key."""

    h = hashlib.sha256()
    for key in sorted(state):
        host = state[key].detach().cpu().contiguous()
        h.update(f"{key}:{host.dtype}:{list(host.shape)}".encode())
        h.update(ctypes.string_at(host.data_ptr(), host.numel() * host.element_size()))
    return h.hexdigest()


CHILD = r"""
import json, os, signal, sys, time
from pathlib import Path
import torch
sys.path.insert(0, sys.argv[3])
from gpu_flash_smoke import digest
from dlu_elastic.checkpoint import FlashCheckpointer

folder, out = Path(sys.argv[1]), Path(sys.argv[2])
g = torch.Generator(device="cuda").manual_seed(0)
state = {
    "w": torch.randn(64 << 20, device="cuda", generator=g),  # 256 MiB
    "h": torch.randn(4096, device="cuda", generator=g).to(torch.bfloat16),
    "n": torch.arange(1000, device="cuda", dtype=torch.int64),
    "c": torch.ones(7),
}
ckpt = FlashCheckpointer(folder)
sums, times = {}, []
for step in range(1, 5):
    state["w"].mul_(1.01).add_(step)
    state["h"].add_(1)
    state["n"] += step
    state["c"] *= 2
    torch.cuda.synchronize()
    sums[step] = digest(state)
    (out / "sums.json").write_text(json.dumps(sums))
    began = time.perf_counter()
    ckpt.save(step, state)
    queued = time.perf_counter() - began
    if step == 4:
        os.kill(os.getpid(), signal.SIGKILL)
    ckpt.wait()
    times.append((queued, time.perf_counter() - began))
    (out / "times.json").write_text(json.dumps(times))
"""


def skip_reason() -> str | None:
    try:
        import torch
    except ImportError:
        return "torch is not installed"
    if not torch.cuda.is_available():
        return "no CUDA device"
    return None


def main() -> int:
    reason = skip_reason()
    if reason is not None:
        print(f"SKIPPED: {reason}", flush=True)
        return 0
    from dlu_elastic.checkpoint import FlashCheckpointer, shm

    folder = shm.create("gpu-flash-smoke", "rank0")
    out = Path(tempfile.mkdtemp(prefix="dlu-gpu-flash-"))
    try:
        child = subprocess.run(
            [sys.executable, "-c", CHILD, str(folder), str(out), str(HERE)],
            capture_output=True,
            text=True,
            timeout=300,
            env={**os.environ, "RANK": "0", "WORLD_SIZE": "1"},
        )
        if child.returncode != -9:
            print(
                f"FAILED: the child exited {child.returncode}, not SIGKILL:\n{child.stderr[-3000:]}",
                flush=True,
            )
            return 1
        sums = {int(k): v for k, v in json.loads((out / "sums.json").read_text()).items()}
        times = json.loads((out / "times.json").read_text())
        restored = FlashCheckpointer(folder).load()
        assert restored is not None
        got = digest(restored.state)
        if restored.step not in (3, 4) or got != sums[restored.step]:
            print(
                f"FAILED: restored step {restored.step}, checksum {got[:12]} vs saved {sums.get(restored.step, '')[:12]}",
                flush=True,
            )
            return 1
        queued, whole = times[-1]
        print(
            f"PASSED: CUDA state saved at steps 1-4, child SIGKILLed after queuing step 4; restored step "
            f"{restored.step} from {restored.source} with the saved checksum. 256 MiB save: blocked "
            f"{queued * 1000:.1f} ms (copies queued), landed after {whole * 1000:.1f} ms",
            flush=True,
        )
        figure("gpu_flash_save_blocking", queued, "s", label="GPU flash save of 256 MiB: save() blocking")
        figure("gpu_flash_save_landed", whole, "s", label="GPU flash save of 256 MiB: copies landed")
        return 0
    finally:
        shm.remove(folder)


if __name__ == "__main__":
    sys.exit(main())
