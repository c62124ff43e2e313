"""The narrow interfaces the PrimeManager hands its helpers instead of itself: what a helper may
do with the job's state (read it under the lock, change it only through the one apply), so no
helper reaches the manager or its siblings."""

from __future__ import annotations

import threading
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass

from dlu_prime.master.changes import Change
from dlu_prime.master.state import JobState


@dataclass(frozen=True)
class StatePort:
    """The job's state: `state()` to read it (under `lock` where it must not move), `apply` the
    only way to change it (saved before anything acts), `save` for a field a helper set under
    the lock, `wake` to have the loop look now."""

    state: Callable[[], JobState]
    lock: threading.RLock
    apply: Callable[..., None]
    save: Callable[[], None]
    wake: Callable[[], None]
    atomic: Callable[[], AbstractContextManager[None]] = nullcontext  # applies inside: one save

    def change(self, *changes: Change) -> None:
        self.apply(*changes)
