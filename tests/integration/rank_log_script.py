"""A torchrun-style script for tests/integration/test_rank_logs.py: prints on every route a rank
has (Python's print, stderr, a raw write to descriptor 1, a child process), and rank 1 fails its
first attempt once (before the process group, which the other rank waits in), once rank 0 has
printed (a restart stops every rank at once), so the role restarts and the ranks' files get a
second start appended."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path


def main() -> None:
    rank = os.environ["RANK"]
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    print(f"py-stdout rank {rank} attempt {attempt}")
    print(f"py-stderr rank {rank} attempt {attempt}", file=sys.stderr)
    sys.stdout.flush()
    os.write(1, f"fd-stdout rank {rank} attempt {attempt}\n".encode())
    subprocess.run(["echo", f"child-stdout rank {rank} attempt {attempt}"], check=True)
    out = Path(os.environ["OUT_DIR"])
    marker = out / "failed-once"
    if rank == "0" and attempt == "0":
        sys.stderr.flush()
        (out / "rank0-printed").write_text("x")
    if rank == "1" and not marker.exists():
        deadline = time.monotonic() + 120
        while not (out / "rank0-printed").exists() and time.monotonic() < deadline:
            time.sleep(0.01)
        marker.write_text("x")
        print(f"rank {rank} fails on purpose", file=sys.stderr)
        raise SystemExit(3)
    import torch.distributed as dist  # the ranks end together (no rank finishes before a restart)

    dist.init_process_group("gloo")
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
