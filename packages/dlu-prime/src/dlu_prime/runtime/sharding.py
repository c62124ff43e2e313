"""Dynamic data sharding: shards of record indices handed out from a todo queue.

A shard moves todo -> doing (held by one worker) -> done, and is completed exactly once:
- A worker id is stable ("job.role.rank"); each process using it is a session. The first call
  from a new session (the worker restarted alone, or with the whole job) puts the shards its
  earlier session held back at the front of todo, so the restarted worker takes them again
  first. `requeue(worker)` does the same on demand (a worker that will not come back).
- A completion by a session that does not hold the shard (stale, or after a requeue) is refused.
- `complete(worker, shard_id, state=...)` keeps the worker's state with the completion, and
  `restore(worker)` returns it after a restart: a worker that accumulates something over its
  shards counts each shard's records exactly once.
Epochs are laid out lazily, one after another; shard ids are unique across epochs
(id = epoch * shards_per_epoch + index of the range).

The queue is one detached, named Ray actor per (job, queue), kept across every recovery of the
job's actors. Caveat: its state is in memory; if its own process dies Ray restarts it
(`max_restarts=-1`) from the creation arguments, i.e. from the start of epoch 0. The
PrimeMaster owns queues and records them in its state.
"""

from __future__ import annotations

import logging
import random
from collections import deque
from dataclasses import asdict, dataclass
from typing import Any, cast

import ray
from ray.exceptions import RayActorError

from dlu_prime.naming import NAMESPACE, shard_queue_name
from dlu_prime.runtime.delivery import session_id

logger = logging.getLogger(__name__)


class ShardQueueError(Exception):
    """Base of every shard-queue error."""


class ShardQueueNotFoundError(ShardQueueError, LookupError):
    """No shard-queue actor of that name exists (never created, or destroyed)."""


class ShardQueueUnavailableError(ShardQueueError):
    """The queue actor died during the call; it restarts from epoch 0 (see the module docstring)."""


@dataclass(frozen=True)
class Shard:
    """Records [start, end) of the dataset."""

    id: int
    start: int
    end: int


@dataclass(frozen=True)
class _Plan:
    dataset_size: int
    shard_size: int
    num_epochs: int
    shuffle: bool
    seed: int

    @property
    def shards_per_epoch(self) -> int:
        return -(-self.dataset_size // self.shard_size)

    def epoch(self, epoch: int) -> list[Shard]:
        """The epoch's shards in hand-out order; the same for the same plan, in any process."""
        n = self.shards_per_epoch
        shards = [
            Shard(epoch * n + i, i * self.shard_size, min((i + 1) * self.shard_size, self.dataset_size))
            for i in range(n)
        ]
        if self.shuffle:
            # A str seed hashes with SHA-512: stable across processes, unlike hash().
            random.Random(f"{self.seed}/{epoch}").shuffle(shards)
        return shards


class ShardBook:
    """The queue's state and rules. Pure (no Ray): the queue actor is this class, one call at a
    time, every method short."""

    def __init__(self, plan: _Plan) -> None:
        self._plan = plan
        self._epoch = 0
        self._todo: deque[Shard] = deque(plan.epoch(0))
        self._doing: dict[int, tuple[str, Shard]] = {}
        self._done: set[int] = set()
        self._sessions: dict[str, str] = {}
        self._states: dict[str, Any] = {}

    def plan(self) -> _Plan:
        return self._plan

    def enter(self, worker: str, session: str) -> list[int]:
        """Makes `session` the worker's current one; when it replaces an earlier session, the
        shards that session held go back to the front of todo (returned)."""
        previous = self._sessions.get(worker)
        self._sessions[worker] = session
        if previous is None or previous == session:
            return []
        ids = self.requeue(worker)
        if ids:
            logger.info("worker %s restarted: its shards %s are back in todo", worker, ids)
        return ids

    def next_shard(self, worker: str, session: str = "") -> Shard | None:
        self.enter(worker, session)
        if not self._todo and self._epoch + 1 < self._plan.num_epochs:
            self._epoch += 1
            self._todo.extend(self._plan.epoch(self._epoch))
        if not self._todo:
            return None
        shard = self._todo.popleft()
        self._doing[shard.id] = (worker, shard)
        return shard

    def complete(
        self, worker: str, shard_id: int, session: str = "", state: Any = None, commit: bool = False
    ) -> bool:
        self.enter(worker, session)
        held = self._doing.get(shard_id)
        if held is None or held[0] != worker:
            return False
        del self._doing[shard_id]
        self._done.add(shard_id)
        if commit:
            self._states[worker] = state
        return True

    def restore(self, worker: str, session: str = "") -> Any:
        self.enter(worker, session)
        return self._states.get(worker)

    def requeue(self, worker: str) -> list[int]:
        mine = [shard for owner, shard in self._doing.values() if owner == worker]
        for shard in mine:
            del self._doing[shard.id]
        self._todo.extendleft(reversed(mine))
        return [shard.id for shard in mine]

    def progress(self) -> dict[str, int]:
        return {
            "todo": len(self._todo) + self._plan.shards_per_epoch * (self._plan.num_epochs - 1 - self._epoch),
            "doing": len(self._doing),
            "done": len(self._done),
            "total": self._plan.shards_per_epoch * self._plan.num_epochs,
            "epoch": self._epoch,
            "num_epochs": self._plan.num_epochs,
        }

    def doing(self) -> dict[int, str]:
        return {shard_id: owner for shard_id, (owner, _) in self._doing.items()}

    def finished(self) -> bool:
        return len(self._done) == self._plan.shards_per_epoch * self._plan.num_epochs


_RemoteShardQueueActor = ray.remote(ShardBook)

# `state=` left out: complete without touching the kept state.
_UNSET: Any = object()


class ShardQueue:
    """Picklable handle to one shard queue; pass it to worker actors as an argument.

    Worker ids are stable strings (e.g. "job.role.rank") so a restarted worker has the same id.
    """

    def __init__(self, job: str, name: str, actor: Any) -> None:
        self.job = job
        self.name = name
        self._actor: Any = actor  # a Ray ActorHandle (untyped remote methods)

    def __repr__(self) -> str:
        return f"ShardQueue(job={self.job!r}, name={self.name!r})"

    @property
    def ray_name(self) -> str:
        """The actor's name in the `dlu` namespace."""
        return shard_queue_name(self.job, self.name)

    @classmethod
    def create(
        cls,
        job: str,
        name: str,
        dataset_size: int,
        shard_size: int,
        num_epochs: int = 1,
        shuffle: bool = False,
        seed: int = 0,
    ) -> ShardQueue:
        """Creates the queue actor, or adopts the existing one of that name (same arguments)."""
        for arg, value in (("job", job), ("name", name)):
            if not isinstance(value, str) or not value:  # pyright: ignore[reportUnnecessaryIsInstance]
                raise ValueError(f"{arg} must be a non-empty string, got {value!r}")
        for arg, value in (
            ("dataset_size", dataset_size),
            ("shard_size", shard_size),
            ("num_epochs", num_epochs),
        ):
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:  # pyright: ignore[reportUnnecessaryIsInstance]
                raise ValueError(f"{arg} must be an integer > 0, got {value!r}")
        if isinstance(seed, bool) or not isinstance(seed, int):  # pyright: ignore[reportUnnecessaryIsInstance]
            raise ValueError(f"seed must be an integer, got {seed!r}")
        plan = _Plan(dataset_size, shard_size, num_epochs, bool(shuffle), seed)
        actor: Any = _RemoteShardQueueActor.options(
            name=shard_queue_name(job, name),
            namespace=NAMESPACE,
            lifetime="detached",
            get_if_exists=True,
            num_cpus=0,
            max_restarts=-1,
        ).remote(plan)
        queue = cls(job, name, actor)
        existing = cast(_Plan, queue._call(actor.plan.remote()))
        if existing != plan:
            raise ValueError(
                f"shard queue {queue.ray_name!r} already exists with {asdict(existing)}, not {asdict(plan)}: "
                "use ShardQueue.open, or destroy it first"
            )
        logger.debug("shard queue %s ready: %s", queue.ray_name, plan)
        return queue

    @classmethod
    def open(cls, job: str, name: str) -> ShardQueue:
        """Finds an existing queue by name."""
        try:
            actor: Any = ray.get_actor(shard_queue_name(job, name), namespace=NAMESPACE)  # pyright: ignore[reportUnknownMemberType, reportUnknownVariableType]
        except ValueError as exc:
            raise ShardQueueNotFoundError(
                f"no shard queue {shard_queue_name(job, name)!r} in namespace {NAMESPACE!r}: "
                "create it with ShardQueue.create first"
            ) from exc
        return cls(job, name, actor)

    def next_shard(self, worker: str) -> Shard | None:
        """Moves the next shard from todo to doing, held by `worker` (this process).

        A worker restarted in a new process first gets back, at the front of todo, the shards
        its dead process held. None means nothing is left to hand out *now*: either all is done
        (`finished()`), or the remaining shards are held by other workers (a dead one's come
        back when it restarts, or through `requeue`); a worker that wants to help drain them
        polls `finished()` and asks again.
        """
        return cast(Shard | None, self._call(self._actor.next_shard.remote(worker, session_id())))

    def complete(self, worker: str, shard_id: int, *, state: Any = _UNSET) -> bool:
        """Marks the shard done if this process (as `worker`) holds it, keeping `state` (the
        worker's state with this shard's records counted in) for `restore`. A stale completion
        returns False and changes nothing."""
        commit = state is not _UNSET
        ref = self._actor.complete.remote(worker, shard_id, session_id(), state if commit else None, commit)
        return cast(bool, self._call(ref))

    def restore(self, worker: str) -> Any:
        """The state `worker` last kept with a completion (None if never): call it first thing
        after a (re)start. Shards completed with that state are done; the ones it held unfinished
        come back to it first."""
        return self._call(self._actor.restore.remote(worker, session_id()))

    def requeue(self, worker: str) -> list[int]:
        """Puts the worker's shards in doing back at the front of todo, for any worker to take:
        for a worker that will not come back (a restarted one gets them back by itself).
        Returns their ids."""
        ids = cast(list[int], self._call(self._actor.requeue.remote(worker)))
        if ids:
            logger.info("shard queue %s: re-queued shards %s of worker %s", self.ray_name, ids, worker)
        return ids

    def progress(self) -> dict[str, int]:
        """Counts: todo (including epochs not laid out yet), doing, done, total; epoch, num_epochs."""
        return cast(dict[str, int], self._call(self._actor.progress.remote()))

    def doing(self) -> dict[int, str]:
        """Shard id -> the worker holding it."""
        return cast(dict[int, str], self._call(self._actor.doing.remote()))

    def finished(self) -> bool:
        """Every shard of every epoch is done."""
        return cast(bool, self._call(self._actor.finished.remote()))

    def destroy(self) -> None:
        """Kills the actor; the name is free again."""
        ray.kill(self._actor, no_restart=True)  # pyright: ignore[reportUnknownMemberType]

    def _call(self, ref: Any) -> Any:
        try:
            return ray.get(ref)
        except RayActorError as exc:
            raise ShardQueueUnavailableError(
                f"shard queue {self.ray_name!r} died during the call: {exc}"
            ) from exc
