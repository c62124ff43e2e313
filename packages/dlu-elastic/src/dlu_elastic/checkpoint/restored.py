"""What `load()` returns, or raises when there is nothing to restore: in a module of their own
so that both api.py and fallback_load.py build them without importing each other."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from dlu_elastic.checkpoint.errors import CheckpointError


class NoCheckpoint(CheckpointError):
    """No step was committed by every rank, in memory or on disk."""


@dataclass(frozen=True)
class Restored:
    """What `load()` found: the step, this rank's state, and where it came from."""

    step: int
    state: Any
    source: str  # "memory", "replica" (a buddy agent's copy) or "disk"
    where: str
    lost_steps: int | None = None  # the newest step any rank had reached minus `step` (None: unknown)
    why: str = ""  # how memory served it, or why it did not (a resize, a rank with no copy)
