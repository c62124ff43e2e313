"""An unmodified torchrun script: `torchrun --nproc-per-node=2 allreduce.py` or, under DLU,
`dlu run --device-type cpu -- torchrun --nnodes=2 --nproc-per-node=2 examples/elastic/allreduce.py`.
"""

import os

import torch
import torch.distributed as dist


def main() -> None:
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    value = torch.tensor([float(rank + 1)])
    dist.all_reduce(value)
    expected = world * (world + 1) / 2
    assert value.item() == expected, (value.item(), expected)
    local = os.environ["LOCAL_RANK"]
    print(f"rank {rank}/{world} (local {local}, node {os.environ.get('GROUP_RANK')}): sum {value.item():g}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
