"""Flash checkpoints: a rank's state saved into its agent's shared memory, restored from it.

`save(step, state)` blocks only for the copy into host memory owned by the rank's agent (which
outlives the training process); `load()` returns the newest step every rank committed, from
memory after an in-place restart, else from the persisted copies. See docs/checkpointing.md.
"""

from dlu_elastic.checkpoint import disk, shm
from dlu_elastic.checkpoint.api import FlashCheckpointer, NoCheckpoint, Restored, load, save, wait
from dlu_elastic.checkpoint.layout import CheckpointError, LayoutChanged
from dlu_elastic.checkpoint.slot import ShmFull

__all__ = [
    "CheckpointError",
    "FlashCheckpointer",
    "LayoutChanged",
    "NoCheckpoint",
    "Restored",
    "ShmFull",
    "disk",
    "load",
    "save",
    "shm",
    "wait",
]
