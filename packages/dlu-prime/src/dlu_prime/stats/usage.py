"""An actor's own CPU and memory, for its status answer (the PrimeMaster's poll carries them).

The PrimeMaster polls every actor each monitor interval (0.1 s on the reference job), so this
runs that often in every actor, during a restart too: the children of its processes come from
one pass over the process table reused for a while (`process_tree`), not from a pass per
process looked at (four per answer of a rank's agent, most of its CPU)."""

from __future__ import annotations

from collections.abc import Sequence

import psutil

from dlu_prime.stats.process_tree import ProcessTree
from dlu_prime.stats.resources import ProcessSampler


class UsageSampler:
    """CPU (percent of one core, since the previous poll) and resident memory of the given
    processes and their children, summed (a process already a child of an earlier one is
    counted once); empty where none could be read."""

    def __init__(self, tree: ProcessTree | None = None) -> None:
        self._sampler = ProcessSampler()
        self.tree = tree if tree is not None else ProcessTree()
        self._node_memory: int | None = None

    def sample(self, pids: Sequence[int]) -> dict[str, float | int]:
        cpu, memory, seen = 0.0, 0, False
        counted: set[int] = set()
        for pid in dict.fromkeys(pids):
            if pid in counted:
                continue
            found = self._sampler.sample(pid, 0.0, tree=self.tree)
            if found is None:
                continue
            seen = True
            cpu += found.cpu_percent or 0.0
            memory += found.memory_bytes or 0
            counted.add(pid)
            counted.update(self.tree.descendants(pid))
        self._sampler.keep_only(counted)  # an actor forking short-lived children holds no more each time
        if not seen:
            return {}
        if self._node_memory is None:  # a memory relaunch never asks for more than this
            self._node_memory = int(psutil.virtual_memory().total)
        return {"cpu_percent": cpu, "memory_bytes": memory, "node_memory_bytes": self._node_memory}
