"""CPU and memory of the processes a job runs (psutil, as Ray's own dashboard agent uses), and the
backlog of its data channels and shard queues, as statistics samples."""

from __future__ import annotations

import logging

import psutil

from dlu_prime.brain_port.models import StatSample
from dlu_prime.stats.process_tree import ProcessTree

logger = logging.getLogger(__name__)


class ProcessSampler:
    """Samples processes by PID; the first sample of a process has cpu_percent 0 (psutil measures
    CPU between two calls), the next ones its use since the previous call."""

    def __init__(self) -> None:
        self._procs: dict[int, psutil.Process] = {}

    def sample(
        self,
        pid: int,
        now: float,
        *,
        role: str | None = None,
        actor: str | None = None,
        node_id: str | None = None,
        memory_limit_bytes: int | None = None,
        children: bool = True,
        tree: ProcessTree | None = None,
    ) -> StatSample | None:
        """CPU (percent of one core, summed over the process and its children) and resident
        memory; None for a process that is gone. `tree`: where to find the children (one pass
        over the process table shared by many samples); without it psutil reads the whole
        table for this call."""
        try:
            proc = self._procs.get(pid)
            if proc is None:
                proc = self._procs[pid] = psutil.Process(pid)
            cpu = proc.cpu_percent(None)
            rss = proc.memory_info().rss
            if children:
                for child in self._children(proc, tree):
                    cached = self._procs.setdefault(child.pid, child)
                    try:
                        cpu += cached.cpu_percent(None)
                        rss += cached.memory_info().rss
                    except (psutil.NoSuchProcess, psutil.AccessDenied):
                        self._procs.pop(child.pid, None)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            self._procs.pop(pid, None)
            return None
        return StatSample(
            time=now,
            kind="resource",
            role=role,
            actor=actor,
            node_id=node_id,
            cpu_percent=cpu,
            memory_bytes=rss,
            memory_limit_bytes=memory_limit_bytes,
        )

    def _children(self, proc: psutil.Process, tree: ProcessTree | None) -> list[psutil.Process]:
        if tree is None:
            return proc.children(recursive=True)
        found: list[psutil.Process] = []
        for pid in tree.descendants(proc.pid):
            cached = self._procs.get(pid)
            try:
                found.append(cached if cached is not None else psutil.Process(pid))
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue
        return found

    def keep_only(self, pids: set[int]) -> None:
        """Forget every process but these (children that exited are never asked about again)."""
        for pid in [p for p in self._procs if p not in pids]:
            del self._procs[pid]


def backlog_sample(
    channel: str, backlog: int, now: float, role: str | None = None, drain_per_actor: float | None = None
) -> StatSample:
    """The items waiting in a data channel or shard queue (drained by `role`, if known), and in
    `samples_per_s` the items one actor of that role takes per second while it has work, once
    measured: the rate a backlog is sized by, which the role's steps/s need not be (a step may
    take several items, and the steps count the time the queue was empty too)."""
    return StatSample(time=now, kind="backlog", channel=channel, backlog=max(0, backlog), role=role,
                      samples_per_s=drain_per_actor)  # fmt: skip
