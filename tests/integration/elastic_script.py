"""A torchrun-style training script for tests/integration/test_training_process.py.

Records its argv; when MASTER_PORT is set it sets up its own process group (as under torchrun)
and allreduces rank+1.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path


def main() -> None:
    record: dict[str, object] = {"argv": sys.argv, "name": __name__, "cwd": os.getcwd()}
    rank = os.environ.get("RANK", "0")
    if os.environ.get("MASTER_PORT"):
        import torch
        import torch.distributed as dist

        dist.init_process_group("gloo")
        value = torch.tensor([float(dist.get_rank() + 1)])
        dist.all_reduce(value)
        record["sum"] = value.item()
        record["world_size"] = dist.get_world_size()
        dist.destroy_process_group()
    out = Path(os.environ["OUT_DIR"]) / f"script-{rank}.json"
    out.write_text(json.dumps(record))


if __name__ == "__main__":
    main()
