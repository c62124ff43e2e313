"""An unmodified torchrun script (no DLU import) for tests/integration/test_torchrun_parity.py.

Each rank writes its whole environment and the process group's view to
$OUT_DIR/env-r<RANK>-a<TORCHELASTIC_RESTART_COUNT>.json, after an allreduce. With CRASH_ONCE
set, rank CRASH_RANK (default 1) raises once, through torch's `@record`, so its error file is
written (with CRASH_HARD it writes the file itself and leaves by `os._exit(3)`); a marker file in OUT_DIR makes it crash only once. With HOLD_FIRST_S, the first
round's ranks wait that long (at most) after writing, for the test to kill one's actor.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.elastic.multiprocessing.errors import ErrorHandler, record


@record
def main() -> None:
    out = Path(os.environ["OUT_DIR"])
    dist.init_process_group("gloo")
    value = torch.tensor([float(dist.get_rank() + 1)])
    dist.all_reduce(value)
    rank = os.environ["RANK"]
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "?")
    record_ = {"env": dict(os.environ), "sum": value.item(), "world": dist.get_world_size()}
    (out / f"env-r{rank}-a{attempt}.json").write_text(json.dumps(record_))
    marker = out / "crashed"
    if os.environ.get("CRASH_ONCE") and rank == os.environ.get("CRASH_RANK", "1") and not marker.exists():
        marker.write_text(rank)
        if os.environ.get("CRASH_HARD"):  # the error file written by hand, then no Python exit
            ErrorHandler().record_exception(RuntimeError(f"hard crash of rank {rank}"))
            os._exit(3)
        raise RuntimeError(f"injected crash of rank {rank}")
    if attempt == "0":
        time.sleep(float(os.environ.get("HOLD_FIRST_S", "0")))  # killed meanwhile, when a test wants
    time.sleep(float(os.environ.get("HOLD_S", "0")))  # a restarted rank stays up a while
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
