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
from typing import TYPE_CHECKING

from dlu_api.vocabulary import ActorStage
from dlu_prime.master.changes import ActorsPlaced
from dlu_prime.master.lifecycle import FencedError, start_targets
from dlu_prime.master.resize import ResizeBegan, ResizeEnded, ResizePlan, TargetSet, plan_resize
from dlu_prime.master.state import SUB_MASTER_RANK, JobState, RequestOutcome, ResizeRecord, role_size

if TYPE_CHECKING:
    from dlu_prime.master.manager import PrimeManager

logger = logging.getLogger(__name__)


def extra_ranks(state: JobState) -> dict[str, list[int]]:
    """Ranks of each simple role beyond its spec total (added by earlier resizes)."""
    out: dict[str, list[int]] = {}
    for record in state.actors.values():
        total = state.spec.role(record.role).total
        if record.rank != SUB_MASTER_RANK and record.rank >= total:
            out.setdefault(record.role, []).append(record.rank)
    return out


class ResizeRunner:
    def __init__(self, manager: PrimeManager) -> None:
        self._manager = manager
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
        m = self._manager
        with m.lock:
            plan = plan_resize(m.state, role, size)
            if not plan.added and not plan.removed:
                if plan.nodes is not None and cause == "dlu scale":
                    m.apply(TargetSet(role, plan.nodes))
                return plan
            m.apply(ResizeBegan(plan, cause, request_id=request_id))
            if plan.nodes is not None:
                m.wake()
                return plan
            # known at once, so a failover that replaces one of them before the resize runs can
            m.scheduler.know(role, [rank for _, rank in plan.added], plan.new_size)
        m.wake()
        return plan

    def known(self, request_id: str) -> RequestOutcome | ResizeRecord | None:
        """A request seen before: its outcome, or its resize still in flight; None if new."""
        state = self._manager.state
        with self._manager.lock:
            if request_id in state.requests:
                return state.requests[request_id]
            if state.resize is not None and state.resize.request_id == request_id:
                return state.resize
        return None

    def wait(self, timeout_s: float) -> bool:
        """Whether no resize is in flight, waiting up to `timeout_s` for the current one."""
        with self._done:
            return self._done.wait_for(lambda: self._manager.state.resize is None, timeout_s)

    def adopt(self) -> None:
        """A restarted PrimeMaster: tell the scheduler about actors earlier resizes added."""
        state = self._manager.state
        for role, ranks in extra_ranks(state).items():
            self._manager.scheduler.know(role, ranks, role_size(state, role))

    def resume(self) -> None:
        """Run the saved in-flight resize to its end; the record is cleared on every path."""
        m = self._manager
        record = m.state.resize
        if record is None:
            return
        if record.nodes is not None:  # an elastic role's: node counts, through its SubMaster
            m.elastic.run(record)
            with self._done:
                self._done.notify_all()
            return
        error: str | None = None
        requeued: dict[str, list[int]] = {}
        try:
            if record.added:
                waiting = [n for n in record.added if m.state.actors[n].stage is ActorStage.INIT]
                ranks = [m.state.actors[n].rank for n in waiting]
                if ranks:
                    nodes = m.scheduler.add_actors(record.role, ranks, record.new_size)
                    m.apply(ActorsPlaced(nodes, ActorStage.READY, fresh=True))
                targets = set(start_targets(m.state))
                m.scheduler.start([n for n in record.added if n in targets])
            if record.removed:
                m.scheduler.remove_actors(list(record.removed))
                # Only once they are gone: a stopped worker can no longer take a shard back.
                queues = [c.name for c in m.state.channels.values() if c.kind == "shards"]
                if queues:
                    requeued = m.scheduler.requeue_shards(queues, list(record.removed))
        except FencedError:
            raise
        except Exception as exc:
            error = f"{type(exc).__name__}: {exc}"
            logger.exception("job %s: resize of role %s failed", m.state.job, record.role)
            if record.added:
                try:
                    m.scheduler.remove_actors(list(record.added))
                except Exception:
                    logger.exception("job %s: removing the actors of a failed resize failed", m.state.job)
        m.apply(ResizeEnded(error, requeued))
        with self._done:
            self._done.notify_all()
