"""Flash checkpoints: a rank's state saved into its agent's shared memory, restored from it.

`save(step, state)` blocks only for the copy into host memory owned by the rank's agent (which
outlives the training process); `load()` returns the newest step every rank committed, from
memory after an in-place restart, else from the persisted copies. See docs/checkpointing.md.

The names are loaded on first use (PEP 562): the agent imports `checkpoint.agent` and must not
pay for torch, which only the training process's side (`api`, `layout`) imports.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from dlu_elastic.checkpoint import disk, shm
    from dlu_elastic.checkpoint.api import FlashCheckpointer, NoCheckpoint, Restored, load, save, wait
    from dlu_elastic.checkpoint.errors import CheckpointError, LayoutChanged
    from dlu_elastic.checkpoint.slot import ShmFull

_WHERE = {
    "CheckpointError": "errors",
    "LayoutChanged": "errors",
    "FlashCheckpointer": "api",
    "NoCheckpoint": "api",
    "Restored": "api",
    "load": "api",
    "save": "api",
    "wait": "api",
    "ShmFull": "slot",
}

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


def __getattr__(name: str) -> Any:
    if name in ("disk", "shm"):
        return importlib.import_module(f"{__name__}.{name}")
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{module}"), name)
