"""Running a resize (`dlu scale`): the I/O between `ResizeBegan` and `ResizeEnded`.

A request is judged (`resize.plan_resize`, pure) and saved in flight by the caller's thread;
the PrimeManager's loop runs it (`resume`), so monitoring and failovers never interleave with
it, and a PrimeMaster restarted half way finishes the saved one the same way. Every step is
idempotent: actors are created or adopted by name, start is idempotent, removal skips what is
already gone.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from dlu_api.vocabulary import ActorStage
from dlu_prime.master.changes import ActorsPlaced
from dlu_prime.master.lifecycle import FencedError, start_targets
from dlu_prime.master.ports import StatePort
from dlu_prime.master.resize import ResizeBegan, ResizeEnded, ResizePlan, TargetSet, plan_resize
from dlu_prime.master.state import RequestOutcome, ResizeRecord
from dlu_prime.scheduler.base import Scheduler

logger = logging.getLogger(__name__)


class ResizeRunner:
    def __init__(
        self, port: StatePort, scheduler: Scheduler, run_elastic: Callable[[ResizeRecord], None]
    ) -> None:
        self._port = port
        self._scheduler = scheduler
        self._run_elastic = run_elastic  # an elastic role's resize: node counts, through its SubMaster
        self._done = threading.Condition()

    def request(
        self, role: str, size: int, cause: str = "dlu scale", request_id: str | None = None
    ) -> ResizePlan:
        """Judge and save a resize in flight, then wake the loop that runs it. The size the role
        has already: nothing saved or counted (a retried `dlu scale` is harmless). `request_id`
        is saved with the resize, so a retry of the request finds it (`known`).

        Raises:
            ScaleError: refused (the message names the value and the fix); nothing changed.
        """
        with self._port.lock:
            plan = plan_resize(self._port.state(), role, size)
            if not plan.added and not plan.removed:
                if plan.nodes is not None and cause == "dlu scale":
                    self._port.apply(TargetSet(role, plan.nodes))
                return plan
            self._port.apply(ResizeBegan(plan, cause, request_id=request_id))
            if plan.nodes is not None:
                self._port.wake()
                return plan
            # known at once, so a failover that replaces one of them before the resize runs can
            self._scheduler.know(role, [rank for _, rank in plan.added], plan.new_size)
        self._port.wake()
        return plan

    def known(self, request_id: str) -> RequestOutcome | ResizeRecord | None:
        """A request seen before: its outcome, or its resize still in flight; None if new."""
        state = self._port.state()
        with self._port.lock:
            if request_id in state.requests:
                return state.requests[request_id]
            if state.resize is not None and state.resize.request_id == request_id:
                return state.resize
        return None

    def wait(self, timeout_s: float) -> bool:
        """Whether no resize is in flight, waiting up to `timeout_s` for the current one."""
        with self._done:
            return self._done.wait_for(lambda: self._port.state().resize is None, timeout_s)

    def resume(self) -> None:
        """Run the saved in-flight resize to its end; the record is cleared on every path."""
        record = self._port.state().resize
        if record is None:
            return
        if record.nodes is not None:  # an elastic role's: node counts, through its SubMaster
            self._run_elastic(record)
            with self._done:
                self._done.notify_all()
            return
        error: str | None = None
        requeued: dict[str, list[int]] = {}
        try:
            if record.added:
                waiting = [n for n in record.added if self._port.state().actors[n].stage is ActorStage.INIT]
                ranks = [self._port.state().actors[n].rank for n in waiting]
                if ranks:
                    nodes = self._scheduler.add_actors(record.role, ranks, record.new_size)
                    self._port.apply(ActorsPlaced(nodes, ActorStage.READY, fresh=True))
                targets = set(start_targets(self._port.state()))
                self._scheduler.start([n for n in record.added if n in targets])
            if record.removed:
                self._scheduler.remove_actors(list(record.removed))
                # Only once they are gone: a stopped worker can no longer take a shard back.
                queues = [c.name for c in self._port.state().channels.values() if c.kind == "shards"]
                if queues:
                    requeued = self._scheduler.requeue_shards(queues, list(record.removed))
        except FencedError:
            raise
        except Exception as exc:
            error = f"{type(exc).__name__}: {exc}"
            logger.exception("job %s: resize of role %s failed", self._port.state().job, record.role)
            if record.added:
                try:
                    self._scheduler.remove_actors(list(record.added))
                except Exception:
                    logger.exception(
                        "job %s: removing the actors of a failed resize failed", self._port.state().job
                    )
        self._port.apply(ResizeEnded(error, requeued))
        with self._done:
            self._done.notify_all()
