"""The agent side of flash checkpoints must not import torch: every ElasticWorker agent imports
it, and on a small machine four agents importing torch (about 2 s of CPU each) pushed a job's
first step back by over a second (`benchmarks/job_e2e.py`). Only the training process's side
(`checkpoint.api`, `checkpoint.layout`) needs torch, and its zygote has it preloaded (torch
and the training side itself, which every restarted process that restores would import)."""

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


RESTORE_PROBE = """
import importlib, sys
from dlu_elastic.worker.warmup import PRELOAD
for name in PRELOAD:
    importlib.import_module(name)
before = set(sys.modules)
from dlu_elastic import checkpoint
checkpoint.FlashCheckpointer, checkpoint.load, checkpoint.save
print(sorted(m for m in set(sys.modules) - before if m.startswith(("dlu", "torch"))))
"""


def test_the_zygote_preloads_what_a_restoring_training_process_imports() -> None:
    # A restarted process that restores a flash checkpoint imports the training side before
    # its first step: 15 modules (27 to 52 ms measured at 13) of every in-place restart when
    # not preloaded.
    done = subprocess.run([sys.executable, "-c", RESTORE_PROBE], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == "[]", "imported after the zygote's preload"
