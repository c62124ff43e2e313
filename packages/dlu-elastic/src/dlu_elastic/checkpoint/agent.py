"""The rank agent's side of flash checkpoints (held by the ElasticWorker actor).

It owns the rank's shared-memory folder (created at setup, or adopted from the dead agent it
replaces on the same host; removed at stop, kept for an adopter then reaped if the agent dies),
runs the persister when the spec asks for durable copies, tells the training
process where both are (`env`), and relays what the process's load() restored (rank 0's
report file) to the PrimeMaster: a `checkpoint_restored` event and the lost-steps metric.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from pathlib import Path
from typing import Any

from dlu_api.spec.models import CheckpointSettings
from dlu_elastic.checkpoint import replica, shm
from dlu_elastic.checkpoint.persist import Persister
from dlu_elastic.checkpoint.shm import PERSIST_DIR_ENV, REPORT_FILE

logger = logging.getLogger(__name__)

RESTORE_POLL_S = 0.2  # how often the agent looks for its training process's restore report


class AgentCheckpoints:
    def __init__(
        self,
        job: str,
        role: str,
        actor: str,
        settings: CheckpointSettings | None,
        rank: int = 0,
        buddy: str | None = None,
        run: str = "",
        node: str = "",
    ) -> None:
        """`buddy`: the actor name of the agent that keeps this rank's replica (None: none);
        `run`: the job's run id (a folder or replica of another run is never taken); `node`:
        the Ray node it runs on (a folder is adopted on the same node only)."""
        self.job, self.role, self.actor, self.run = job, role, actor, run
        self.folder: Path | None = shm.create(job, actor, run, node)
        self._reaper: int | None = shm.start_reaper(self.folder)
        self._stop = threading.Event()
        self._report_lock = threading.Lock()
        self.persist_base = os.path.join(settings.dir, role) if settings is not None else None
        self.persister = (
            Persister(self.folder, Path(self.persist_base), settings.persist_every, self.record_event).start()
            if settings is not None and self.persist_base is not None
            else None
        )
        self.replicator = (
            replica.Replicator(
                self.folder, rank, lambda slot, data: self._send(buddy, rank, slot, data), self.record_event
            ).start()
            if settings is not None and settings.replicas > 0 and buddy is not None
            else None
        )
        threading.Thread(target=self._report_restores, name="dlu-ckpt-report", daemon=True).start()

    @classmethod
    def of_worker(cls, info: Any, settings: CheckpointSettings | None) -> AgentCheckpoints:
        """The checkpoints of the worker `info` describes (a WorkerInfo), its buddy found."""
        import ray

        from dlu_prime.naming import actor_name

        buddy = replica.buddy_rank(info.rank, info.world_size, info.local_world_size)
        name = None if buddy is None else actor_name(info.job, info.role, buddy)
        node = str(ray.get_runtime_context().get_node_id() or "")
        return cls(info.job, info.role, info.actor_name, settings, info.rank, name, info.run_id, node)

    def env(self) -> dict[str, str]:
        """What the training process needs to find its slots and the durable copies."""
        found: dict[str, str] = {}
        if self.folder is not None:
            found[shm.FOLDER_ENV] = str(self.folder)
        if self.persist_base is not None:
            found[PERSIST_DIR_ENV] = self.persist_base
        return found

    def _master(self) -> Any:
        from dlu_prime.naming import master_name

        return self._actor(master_name(self.job))

    @staticmethod
    def _actor(name: str) -> Any:
        import ray

        from dlu_prime.naming import NAMESPACE

        return ray.get_actor(name, namespace=NAMESPACE)

    def training_process(self, pid: int) -> None:
        """The agent started a training process: an adopter of this folder waits for its end."""
        if self.folder is not None:
            shm.note_trainer(self.folder, pid)

    def _send(self, buddy: str, rank: int, slot: int, data: bytes | None) -> None:
        import ray

        call = self._actor(buddy).receive_replica.remote(self.run, rank, slot, data)
        ray.get(call, timeout=replica.CALL_TIMEOUT_S)

    def receive_replica(self, run: str, rank: int, slot: int, data: bytes | None) -> None:
        """Keep a copy of a buddied rank's slot (two files per rank, in this agent's folder);
        `data` None: that slot holds no step any more (its process started afresh)."""
        folder = self.folder
        if folder is None:
            raise RuntimeError(f"{self.actor} has stopped: no replica kept")
        if run != self.run:
            raise ValueError(f"a replica of run {run[:8]!r} sent to an agent of run {self.run[:8]!r}")
        if data is None:
            replica.discard(folder, rank, slot)
        else:
            replica.store(folder, slot, data)

    def record_event(self, kind: str, message: str) -> None:
        """An event in the job's timeline, through the PrimeMaster (best effort: it may be away)."""
        try:
            self._master().record_event.remote(kind, message, self.role)
        except Exception as exc:
            logger.warning("%s: could not record event %s (%s): %s", self.actor, kind, message, exc)

    def _report_restores(self) -> None:
        folder = self.folder
        while folder is not None and not self._stop.wait(RESTORE_POLL_S) and folder.is_dir():
            self.flush_report()

    def flush_report(self) -> None:
        """Relay the training process's restore report, if one waits (the poll above, and the
        agent when its process exits 0: a short job may end before the next poll)."""
        with self._report_lock:
            folder = self.folder
            if folder is None:
                return
            report = folder / REPORT_FILE
            try:
                found = json.loads(report.read_text())
                report.unlink()
            except (FileNotFoundError, ValueError):
                return
        try:
            self._master().checkpoint_restored.remote(
                self.role, int(found["step"]), str(found["source"]), found.get("lost_steps")
            )
        except Exception as exc:
            logger.warning("%s: could not report a checkpoint restore: %s", self.actor, exc)

    def end(self) -> None:
        """The agent stops: last durable write, then the folder goes (idempotent)."""
        self._stop.set()
        replicator, self.replicator = self.replicator, None
        if replicator is not None:
            replicator.stop()
        persister, self.persister = self.persister, None
        if persister is not None:
            persister.stop()
        folder, self.folder = self.folder, None
        if folder is not None:
            shm.remove(folder)
        reaper, self._reaper = self._reaper, None
        if reaper is not None:
            shm.end_reaper(reaper)
