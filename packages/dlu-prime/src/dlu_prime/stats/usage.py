"""An actor's own CPU and memory, for its status answer (the PrimeMaster's poll carries them)."""

from __future__ import annotations

import contextlib
from collections.abc import Sequence

import psutil

from dlu_prime.stats.resources import ProcessSampler


class UsageSampler:
    """CPU (percent of one core, since the previous poll) and resident memory of the given
    processes and their children, summed (a process already a child of an earlier one is
    counted once); empty where none could be read."""

    def __init__(self) -> None:
        self._sampler = ProcessSampler()

    def sample(self, pids: Sequence[int]) -> dict[str, float | int]:
        cpu, memory, seen = 0.0, 0, False
        counted: set[int] = set()
        for pid in dict.fromkeys(pids):
            if pid in counted:
                continue
            found = self._sampler.sample(pid, 0.0)
            if found is None:
                continue
            seen = True
            cpu += found.cpu_percent or 0.0
            memory += found.memory_bytes or 0
            counted.add(pid)
            with contextlib.suppress(psutil.Error):  # gone meanwhile: nothing more to leave out
                counted.update(c.pid for c in psutil.Process(pid).children(recursive=True))
        self._sampler.keep_only(counted)  # an actor forking short-lived children holds no more each time
        if not seen:
            return {}
        node = psutil.virtual_memory().total  # a memory relaunch never asks for more than this
        return {"cpu_percent": cpu, "memory_bytes": memory, "node_memory_bytes": node}
