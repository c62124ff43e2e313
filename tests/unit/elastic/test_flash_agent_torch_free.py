"""The agent side of flash checkpoints must not import torch: every ElasticWorker agent imports
it, and on a small machine four agents importing torch (about 2 s of CPU each) pushed a job's
first step back by over a second (`benchmarks/job_e2e.py`). Only the training process's side
(`checkpoint.api`, `checkpoint.layout`) needs torch, and its zygote has it preloaded."""

from __future__ import annotations

import subprocess
import sys

PROBE = """
import sys
import dlu_elastic.worker.actor
from dlu_elastic.checkpoint.agent import AgentCheckpoints
from dlu_elastic import checkpoint
checkpoint.CheckpointError, checkpoint.LayoutChanged, checkpoint.ShmFull, checkpoint.disk, checkpoint.shm
print("torch" in sys.modules)
"""


def test_the_agent_side_of_flash_checkpoints_imports_no_torch() -> None:
    done = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == "False", "the agent's imports pulled in torch"


def test_the_training_side_names_still_load() -> None:
    from dlu_elastic import checkpoint

    assert callable(checkpoint.save) and callable(checkpoint.load) and callable(checkpoint.wait)
    assert issubclass(checkpoint.LayoutChanged, checkpoint.CheckpointError)
