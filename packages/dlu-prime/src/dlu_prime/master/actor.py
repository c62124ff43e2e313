"""PrimeMaster: the Ray actor that hosts a job's PrimeManager.

It is thin on purpose: it builds the manager, runs its loop in a thread, and answers the
driver's calls (status, stop) and the workers' calls (channels). On reconstruction by Ray it
loads the stored state: a RUNNING job resumes monitoring without touching healthy workers;
any other stage is stopped safely, with the reason saying why.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from typing import Any

import ray

from dlu_api.spec.models import JobSpec
from dlu_api.vocabulary import InPlaceDecision
from dlu_prime.extension import Extension, ExtensionError, load_extension
from dlu_prime.master.manager import FencedError, PrimeManager
from dlu_prime.master.metrics import JobMetrics
from dlu_prime.master.state import RequestOutcome, role_finished
from dlu_prime.scheduler.ray_scheduler import RayScheduler
from dlu_prime.state.base import StateStore, create_state_store
from dlu_prime.worker.actor import was_reconstructed

logger = logging.getLogger(__name__)


class PrimeMaster:
    def __init__(self, spec_json: str, workdir: str | None = None, resume: bool = False) -> None:
        constructed = time.monotonic()
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
        spec = JobSpec.model_validate_json(spec_json)
        self.spec = spec
        self.store: StateStore = create_state_store(spec.state_store.name, spec.state_store.options)
        self.scheduler = RayScheduler(spec, workdir=workdir)
        extension_error: str | None = None
        self.extension: Extension | None = None
        try:
            self.extension = load_extension(spec, workdir)
        except ExtensionError as exc:
            extension_error = str(exc)
        reconstructed = was_reconstructed()
        if reconstructed:
            self.manager = self._recover(spec)
        elif resume:
            self.manager = PrimeManager.resume(spec, self.scheduler, self.store, extension=self.extension)
        else:
            self.manager = PrimeManager.create(spec, self.scheduler, self.store, extension=self.extension)
        self.scheduler.run_id = self.manager.state.run_id  # before any actor is created
        self.manager.metrics = JobMetrics(spec.name)
        if reconstructed and self.manager.state.master_restart_count > 0:
            # What this PrimeMaster sees of its tier: rebuilt -> state loaded and monitoring
            # ready to resume (Ray's detection of the death came before it).
            self.manager.metrics.failover_done("master", time.monotonic() - constructed)
        if extension_error is not None:  # the launcher checks first; this is the last guard
            self.manager.request_stop_failed(f"extension: {extension_error}")
        self._thread: threading.Thread | None = None
        self._done = threading.Event()
        self.start()

    def _recover(self, spec: JobSpec) -> PrimeManager:
        manager = PrimeManager.self_recover(spec, self.scheduler, self.store, extension=self.extension)
        if manager is None:
            logger.warning("job %s: reconstructed with no stored state; starting a new run", spec.name)
            return PrimeManager.create(spec, self.scheduler, self.store, extension=self.extension)
        return manager

    def start(self) -> None:
        """Run the manager loop in the background (idempotent)."""
        if self._thread is not None:
            return
        self._thread = threading.Thread(target=self._loop, name="dlu-prime-manager", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        try:
            self.manager.run()
        except FencedError:
            pass
        finally:
            self._done.set()

    # driver calls ----------------------------------------------------------------------------
    # Read-only calls are retried across a reconstruction: one made while Ray restarts the
    # PrimeMaster is answered once it is back. Without retries Ray fails it after its grace
    # period for news of the death, 1 to 2 s, however soon the new PrimeMaster is up.
    @ray.method(max_task_retries=-1)
    def ping(self) -> dict[str, Any]:
        """Liveness, and where the PrimeMaster runs (isolation scheduling is checked with it)."""
        return {"job": self.spec.name, "node_id": ray.get_runtime_context().get_node_id(), "pid": os.getpid()}

    @ray.method(max_task_retries=-1)
    def status(self, events: int = 50, events_after: int | None = None) -> dict[str, Any]:
        """The status with the last `events` events, or every event past the cursor `events_after`."""
        return self.manager.status(events, events_after).model_dump(mode="json")

    def stop(self, reason: str = "stopped by user request") -> None:
        self.manager.request_stop(reason)

    def scale(
        self, role: str, size: int, wait_s: float = 45.0, request_id: str | None = None
    ) -> dict[str, Any]:
        """`dlu scale`: saved in flight at once (refused with a ValueError naming the fix), then
        run by the manager's loop; waits up to `wait_s` for it to end. A `request_id` seen before
        (a retry after this PrimeMaster was rebuilt) is answered from what the request came to,
        never run twice."""
        resizer = self.manager.resizer
        seen = resizer.known(request_id) if request_id else None
        if isinstance(seen, RequestOutcome):
            return _scale_answer(seen.role, seen.old_size, seen.new_size, True, seen)
        if seen is not None:
            old_size, new_size = seen.old_size, seen.new_size
        else:
            plan = self.manager.request_scale(role, size, request_id=request_id)
            if plan.old_size == plan.new_size:
                return {
                    "role": role,
                    "old_size": size,
                    "new_size": size,
                    "done": True,
                    "failed": False,
                    "message": f"already {size} {'node' if plan.nodes is not None else 'actor'}(s); nothing to do",
                }
            old_size, new_size = plan.old_size, plan.new_size
        done = resizer.wait(wait_s)
        outcome = resizer.known(request_id) if request_id else None
        if isinstance(outcome, RequestOutcome):
            return _scale_answer(role, old_size, new_size, done, outcome)
        ended = [e for e in self.manager.state.events if e.role == role and e.kind.startswith("resize_")]
        last = ended[-1] if ended else None
        return {
            "role": role,
            "old_size": old_size,
            "new_size": new_size,
            "done": done,
            "message": last.message if last else "",
            "failed": bool(last and last.kind == "resize_failed"),
        }

    def wait_stopped(self, timeout: float | None = None) -> bool:
        return self._done.wait(timeout)

    # worker calls ----------------------------------------------------------------------------
    def publish(self, key: str, value: dict[str, str]) -> None:
        self.manager.registry.publish(key, value)

    def lookup(self, key: str) -> dict[str, str] | None:
        return self.manager.registry.lookup(key)

    def restart_actors(self, names: list[str], reason: str) -> None:
        self.manager.restart_actors(names, reason)

    def role_finished(self, role: str) -> bool:
        """Asked by a SubMaster as it is set up (again): have all its role's workers finished?"""
        return role_finished(self.manager.state, role)

    def report_restarted(self, actor: str, node_id: str | None = None) -> None:
        """The seed's RESTARTED report from a reconstructed actor: judge it now (the monitoring
        pass decides, so a report and a poll of one restart cause one recovery)."""
        logger.info("job %s: %s reports it was restarted (node %s)", self.spec.name, actor, node_id)
        self.scheduler.renewed(actor)  # a poll stuck on the old process asks the new one
        self.manager.wake()

    def wake(self) -> None:
        self.manager.wake()

    def note_inplace_restart(
        self,
        role: str,
        message: str,
        agent: str | None = None,
        error: str = "",
        recovered: bool = False,
        report_id: str | None = None,
    ) -> InPlaceDecision:
        return self.manager.note_inplace_restart(role, message, agent, error, recovered, report_id)

    # debugging (the health seed's endpoints) ---------------------------------------------------
    def debug(
        self,
        action: str,
        role: str,
        rank: int | None = None,
        step: int | None = None,
        request_id: str | None = None,
    ) -> dict[str, Any]:
        """mark_unhealthy | get_step | set_step on a role's workers (or one rank). A
        mark_unhealthy `request_id` seen before (a retry) is not marked again."""
        names = self.manager.debug.worker_names(role, rank)
        if action == "get_step":
            steps = self.manager.debug.steps()
            return {name: steps.get(name) for name in names}
        if action == "mark_unhealthy":
            self.manager.mark_unhealthy(names, "marked unhealthy for testing (dlu debug)", request_id)
            return {name: "marked unhealthy" for name in names}
        if action == "set_step":
            if step is None:
                raise ValueError("set_step needs a step")
            return {name: self.scheduler.call(name, "set_step", step) for name in names}
        raise ValueError(f"unknown debug action {action!r}; use mark_unhealthy, get_step or set_step")

    def record_event(
        self,
        kind: str,
        message: str,
        role: str | None = None,
        tier: str | None = None,
        duration_s: float | None = None,
    ) -> None:
        self.manager.record_event(kind, message, role, tier, duration_s)

    def checkpoint_restored(self, role: str, step: int, source: str, lost_steps: int | None) -> None:
        self.manager.checkpoint_restored(role, step, source, lost_steps)

    def create_channel(self, name: str, capacity: int) -> Any:
        from dlu_prime.naming import channel_name
        from dlu_prime.runtime.data_channel import DataChannel

        channel = DataChannel.create(self.spec.name, name, capacity)
        self.manager.registry.register_channel(name, "channel", channel_name(self.spec.name, name))
        return channel

    def create_shard_queue(self, name: str, **options: Any) -> Any:
        from dlu_prime.naming import shard_queue_name
        from dlu_prime.runtime.sharding import ShardQueue

        queue = ShardQueue.create(self.spec.name, name, **options)
        self.manager.registry.register_channel(name, "shards", shard_queue_name(self.spec.name, name))
        return queue


def _scale_answer(
    role: str, old_size: int, new_size: int, done: bool, outcome: RequestOutcome
) -> dict[str, Any]:
    return {
        "role": role,
        "old_size": old_size,
        "new_size": new_size,
        "done": done,
        "failed": outcome.failed,
        "message": outcome.message,
    }
