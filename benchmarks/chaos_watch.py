"""Reading a running job for the chaos campaign: its status, its whole timeline, whether it is
back at work after a fault, and what it left behind once stopped.

The PrimeMaster keeps the last MAX_EVENTS events only, so the timeline is collected as the
campaign goes (every few seconds and around each fault) and merged here.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from chaos_check import RECOVERY_KINDS
from chaos_faults import logged_processes

from dlu_api.status import JobEvent, JobStatus

POLL_S = 0.1
COLLECT_EVERY_S = 2.0


class JobWatch:
    """One job's status, read through its PrimeMaster, and its timeline merged across reads."""

    def __init__(self, job: str, role: str | None = None) -> None:
        self.job = job
        self.role = role
        self.events: list[JobEvent] = []
        self._keys: set[tuple[float, str, str, str | None]] = set()
        self._collected = 0.0

    def status(self, events: int = 0) -> JobStatus | None:
        """The status with its last `events` events (merged into the timeline); None while the
        PrimeMaster does not answer (restarting) or is gone."""
        from dlu_prime import launcher

        try:
            found = launcher.job_status(self.job, events=events)
        except Exception:
            return None
        if found is not None and events:
            self.merge(found.events)
        return found

    def collect(self, force: bool = False) -> JobStatus | None:
        """Read the whole kept timeline (at most every COLLECT_EVERY_S unless `force`)."""
        from dlu_prime.master.state import MAX_EVENTS

        if not force and time.monotonic() - self._collected < COLLECT_EVERY_S:
            return None
        found = self.status(MAX_EVENTS)
        if found is not None:
            self._collected = time.monotonic()
        return found

    def merge(self, events: Iterable[JobEvent]) -> None:
        for event in events:
            key = (event.time, event.kind, event.message, event.actor)
            if key not in self._keys:
                self._keys.add(key)
                self.events.append(event)
        self.events.sort(key=lambda e: e.time)

    def recoveries_since(self, at: float, kinds: frozenset[str] = RECOVERY_KINDS) -> list[JobEvent]:
        return [e for e in self.events if e.time >= at and e.kind in kinds]

    def steps(self, status: JobStatus) -> dict[str, int]:
        """The last step of every rank that reports one (ranks of `role`, SubMasters left out)."""
        return {
            a.name: a.step
            for r in status.roles
            if self.role is None or r.name == self.role
            for a in r.actors
            if a.rank >= 0 and a.step is not None
        }

    def actor_stage(self, status: JobStatus, actor: str) -> str | None:
        return next((a.stage for r in status.roles for a in r.actors if a.name == actor), None)

    def wait_stopped(self, timeout_s: float) -> JobStatus | None:
        """Follow the job to STOPPED, collecting its timeline; its final status (full timeline
        merged), or None if it did not stop in time."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            self.collect()
            found = self.status()
            if found is not None and found.finished:
                self.collect(force=True)
                return found
            time.sleep(0.5)
        return None


@dataclass(frozen=True)
class Back:
    """The outcome of waiting for a job to get back to work after a fault."""

    at: float | None  # time.time() when it was; None: it did not (timeout or the job stopped)
    lost_steps: int = 0
    stopped: bool = False


@dataclass(frozen=True)
class Ranks:
    """A training job's ranks as the campaign follows them: their actors and the pid logs in
    which the training script records each process it starts."""

    actors: tuple[str, ...]
    pid_dir: Path
    checkpoint_every: int

    def pids(self) -> dict[str, int | None]:
        """The latest training process each rank logged."""
        out: dict[str, int | None] = {}
        for actor in self.actors:
            procs = logged_processes(self.pid_dir, actor)
            out[actor] = procs[-1].pid if procs else None
        return out


@dataclass(frozen=True)
class Before:
    """The ranks just before a fault: their steps and processes."""

    steps: dict[str, int]
    pids: dict[str, int | None]


@dataclass
class _Process:
    """What one rank's current process has shown since the campaign first saw it."""

    pid: int | None
    first: int | None  # the step shown then (possibly the previous process's last)
    moves: set[int]


class Recovery:
    """Whether a job trains again after a fault, from successive looks at its ranks (pure).

    Back to training: every rank runs a process started after the fault (if the fault
    `restarted` training) and each of those processes has reported two new steps, so
    collectives across all ranks work again. A step shown right after a restart may still be
    the old process's last one, and old processes may train on for a moment after a recovery
    began: only steps that moved while the rank's current process was known count. A replaced
    actor shows step 0 until its first beat (training steps start at 1): no step, not a move
    back to the start (which had counted every step before the fault as lost).
    """

    def __init__(self, actors: Sequence[str], before: Before, restarted: bool, checkpoint_every: int) -> None:
        self.actors = tuple(actors)
        self.before = before
        self.restarted = restarted
        self.checkpoint_every = checkpoint_every
        self.processes: dict[str, _Process] = {}

    def look(self, pids: Mapping[str, int | None], steps: Mapping[str, int]) -> None:
        """One look: each rank's latest process and the step the job's status shows for it."""
        for actor in self.actors:
            pid = pids.get(actor)
            if self.restarted and pid == self.before.pids.get(actor):
                continue
            step = steps.get(actor) or None  # 0: a replaced actor that has not beaten yet
            known = self.processes.get(actor)
            if known is None or known.pid != pid:
                self.processes[actor] = _Process(pid, step, set())
            elif step is not None and step != known.first:
                known.moves.add(step)

    @property
    def training(self) -> bool:
        return len(self.processes) == len(self.actors) and all(
            len(p.moves) >= 2 for p in self.processes.values()
        )

    @property
    def lost_steps(self) -> int:
        """Steps done before the fault and done again: from the furthest step seen before it back
        to where training resumed (the lowest new step, rounded down to the checkpoint interval)."""
        moved = [step for p in self.processes.values() for step in p.moves]
        if not self.restarted or not moved:
            return 0
        top = max(self.before.steps.values(), default=0)
        every = self.checkpoint_every
        return max(0, top - (max(min(moved) - 1, 0) // every) * every)


def back_to_training(
    watch: JobWatch,
    ranks: Ranks,
    fault_at: float,
    before: Before,
    timeout_s: float,
    *,
    restarted: bool,
    need_event: bool = True,
) -> Back:
    """Wait until a recovery event newer than the fault is on the timeline (unless not
    `need_event`: the job's start) and the job trains again (see `Recovery`)."""
    recovery = Recovery(ranks.actors, before, restarted, ranks.checkpoint_every)
    seen_event = not need_event
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        watch.collect()
        status = watch.status(events=50)
        if status is None:
            time.sleep(POLL_S)
            continue
        if status.finished:
            return Back(None, recovery.lost_steps, stopped=True)
        seen_event = seen_event or bool(watch.recoveries_since(fault_at))
        recovery.look(ranks.pids(), watch.steps(status))
        if seen_event and recovery.training:
            return Back(time.time(), recovery.lost_steps)
        time.sleep(POLL_S)
    return Back(None, recovery.lost_steps)


def back_to_work(watch: JobWatch, fault_at: float, actor: str, timeout_s: float) -> Back:
    """For a role without steps (the pipeline): a recovery event newer than the fault, then the
    actor RUNNING (or FINISHED) again; a stopped job counts as settled (it has nothing to do)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        watch.collect()
        status = watch.status(events=50)
        if status is None:
            time.sleep(POLL_S)
            continue
        if status.finished:
            return Back(time.time(), stopped=True)
        if watch.recoveries_since(fault_at) and watch.actor_stage(status, actor) in ("RUNNING", "FINISH"):
            return Back(time.time())
        time.sleep(POLL_S)
        time.sleep(POLL_S)
    return Back(None)


def wait_for(what: str, check: Callable[[], bool], timeout_s: float, every: float = POLL_S) -> None:
    """Raises TimeoutError naming `what` if `check()` does not hold within `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout_s:.0f} s waiting for {what}")
        time.sleep(every)


def leaks(job: str, pid_dir: Path | None, include_master: bool, timeout_s: float = 15.0) -> list[str]:
    """What a stopped job left: named actors and placement groups of the job (its PrimeMaster
    too with `include_master`) and live training processes from the pid logs. Waits up to
    `timeout_s` for them to go, since stopping is asynchronous."""
    from dlu_prime.naming import master_name
    from dlu_prime.scheduler.cleanup import job_actor_names, job_placement_groups

    def left() -> list[str]:
        found = [
            f"actor {name}" for name in job_actor_names(job) if include_master or name != master_name(job)
        ]
        found += [f"placement group {name} ({pg_id[:8]})" for pg_id, name in job_placement_groups(job)]
        if pid_dir is not None:
            found += [
                f"training process {p.pid} (state {p.state()}) logged in {pid_dir}"
                for p in logged_processes(pid_dir)
                if p.alive
            ]
        return found

    deadline = time.monotonic() + timeout_s
    while True:
        found = left()
        if not found or time.monotonic() > deadline:
            return found
        time.sleep(0.2)
