"""What the PrimeManager needs from a scheduler. The Ray one does I/O; tests use a fake."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from dlu_api.vocabulary import ActorStage


class SchedulingError(Exception):
    """Placement or actor creation failed; the message says what the cluster lacks."""


class ActorSetupError(Exception):
    """An actor failed its self check (setup); carries the actor's name and the error.

    `transient`: the actor's process died during the call (Ray rebuilds it), so the check may be
    run again on the new incarnation; otherwise the check itself failed.
    """

    def __init__(self, actor: str, error: str, transient: bool = False) -> None:
        self.actor = actor
        self.error = error
        self.transient = transient
        super().__init__(f"{actor} failed its self check: {error}")


@dataclass(frozen=True)
class ActorObservation:
    """One poll of one actor. `stage is None` means the actor is gone (dead or unreachable);
    its `node_id` is then where it last ran, where known (`Scheduler.last_nodes`)."""

    stage: ActorStage | None
    error: str | None = None
    node_id: str | None = None
    last_heartbeat: float | None = None
    step: int = 0
    metric: float | None = None  # the last metric its code reported with `heartbeat(step, metric)`
    reported_errors: tuple[str, ...] = field(default=())
    reconstructed: bool = False
    unavailable: bool = False  # Ray is restarting it: it will report itself when back
    beats: int = 0  # beats sent so far: staleness is judged by when this count last moved
    watched: bool = False  # it reports beats of its own: judge heartbeat staleness
    steps_reported: bool = False  # it reports training steps: judge hangs
    incarnation: str | None = None  # which process answered (node and pid): changes when Ray rebuilds it
    cpu_percent: float | None = None  # the actor's processes (psutil, measured by the actor itself)
    memory_bytes: int | None = None  # their resident memory
    node_memory_bytes: int | None = None  # what the actor's node holds (psutil), a memory relaunch's bound

    @staticmethod
    def gone(error: str, node_id: str | None = None) -> ActorObservation:
        return ActorObservation(stage=None, error=error, node_id=node_id)

    @staticmethod
    def restarting(error: str) -> ActorObservation:
        return ActorObservation(stage=None, error=error, unavailable=True)

    @staticmethod
    def from_status(status: dict[str, Any]) -> ActorObservation:
        return ActorObservation(
            stage=ActorStage(status["stage"]),
            error=status.get("error"),
            node_id=status.get("node_id"),
            last_heartbeat=status.get("last_heartbeat"),
            step=int(status.get("step") or 0),
            metric=_metric(status.get("metric")),
            reported_errors=tuple(e["message"] for e in status.get("errors") or ()),
            reconstructed=bool(status.get("reconstructed")),
            beats=int(status.get("beats") or 0),
            watched=bool(status.get("watched")),
            steps_reported=bool(status.get("steps_reported")),
            incarnation=f"{status.get('node_id')}/{status['pid']}" if status.get("pid") else None,
            cpu_percent=_metric(status.get("cpu_percent")),
            memory_bytes=_count(status.get("memory_bytes")),
            node_memory_bytes=_count(status.get("node_memory_bytes")),
        )


def _count(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def _metric(value: Any) -> float | None:
    """A reported metric as a float; None for none, or for what is not a number (shown, never judged)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


class Scheduler(ABC):
    """Creates, drives and removes a job's placement groups and actors."""

    @abstractmethod
    def prepare(self) -> dict[str, str | None]:
        """Create (or adopt, by name) placement groups and actors; return actor -> node id.

        Raises:
            SchedulingError: the cluster cannot hold the job.
        """

    @abstractmethod
    def setup(self, names: Sequence[str]) -> None:
        """Run every actor's self check with its device env.

        Raises:
            ActorSetupError: the first actor that failed.
        """

    @abstractmethod
    def check_children(self, names: Sequence[str]) -> None:
        """Run `check_child` on SubMasters.

        Raises:
            ActorSetupError: a SubMaster's check failed.
        """

    @abstractmethod
    def start(self, names: Sequence[str]) -> None:
        """Call `start` on these actors."""

    @abstractmethod
    def poll(self, names: Sequence[str]) -> dict[str, ActorObservation]:
        """Status of each actor; never raises for a dead actor (it is reported gone)."""

    @abstractmethod
    def restart(self, names: Sequence[str]) -> dict[str, str | None]:
        """Replace these actors with fresh ones (same names, same bundles) and run their self
        checks; return actor -> node id.

        Raises:
            ActorSetupError: a replacement failed its self check.
        """

    @abstractmethod
    def set_memory(self, memory: Mapping[str, int]) -> None:
        """The memory in bytes that the next incarnation of each named actor asks Ray for (a
        memory relaunch), from its next `restart` on; an actor given its role's own amount
        asks as its role does again. SubMasters are not named."""

    @abstractmethod
    def set_seats(self, seats: Mapping[str, str | None]) -> None:
        """The bundle (`group#index`, `scheduler.free_bundles`) of its role's group that the
        next incarnation of each named actor sits in, a bundle another actor left; None: its
        planned place (or, with a memory override, a group of its own) again."""

    @abstractmethod
    def call(self, name: str, method: str, *args: Any, timeout_s: float | None = None) -> Any:
        """Call one method of one actor and return its result.

        Raises:
            ActorSetupError: the actor died or the call raised.
        """

    def dead_nodes(self, node_ids: Sequence[str]) -> set[str]:
        """Which of these nodes the cluster has marked dead (a scheduler that cannot tell: none)."""
        return set()

    def last_nodes(self, names: Sequence[str]) -> dict[str, str]:
        """Where each of these gone actors last ran, as far as the cluster still records it: a
        rebuilt PrimeMaster tells a replacement its predecessor placed, unsaved, from the death
        its failover began for (a scheduler that cannot tell: none)."""
        return {}

    def add_actors(self, role: str, ranks: Sequence[int], world_size: int) -> dict[str, str | None]:
        """Create (or adopt, by name) these new actors of a resized simple role and run their
        self checks; return actor -> node id. Idempotent, so a restarted PrimeMaster can redo it.

        Raises:
            SchedulingError: the cluster cannot hold them (or this scheduler cannot resize).
            ActorSetupError: a new actor failed its self check.
        """
        raise SchedulingError(f"{type(self).__name__} cannot resize roles")

    def remove_actors(self, names: Sequence[str]) -> None:
        """Stop and remove these actors and the placement groups only they used. Idempotent."""
        raise SchedulingError(f"{type(self).__name__} cannot resize roles")

    def requeue_shards(self, queues: Sequence[str], workers: Sequence[str]) -> dict[str, list[int]]:
        """Hand the shards these (stopped) workers held in the job's shard queues back to each
        queue's todo; queue -> ids handed back. Idempotent: a shard is handed back once.

        Raises:
            SchedulingError: this scheduler cannot reach shard queues (it cannot resize either).
        """
        raise SchedulingError(f"{type(self).__name__} cannot resize roles")

    def placed_nodes(self, role: str, nodes: Sequence[int], wait_s: float = 0.0) -> list[int]:
        """Which of these nodes (0-based) of an elastic role with a MIN:MAX range have their
        placement group placed now (waiting up to `wait_s`); a group not yet asked for is asked
        for. A scheduler that cannot tell: all of them."""
        return list(nodes)

    def node_needs(self, role: str) -> str:
        """What one node of an elastic role with a MIN:MAX range needs, against what the cluster
        has free (for a stop reason); '' from a scheduler that cannot tell."""
        return ""

    def drop_actors(self, names: Sequence[str]) -> None:
        """Remove these actors at once, without asking them to stop (their node is lost), and
        keep their placement groups asked for. Idempotent."""
        raise SchedulingError(f"{type(self).__name__} cannot resize roles")

    def remove_node_groups(self, role: str, nodes: Sequence[int]) -> None:
        """Give back the placement groups of these nodes of an elastic role. Idempotent."""
        return None

    def know(self, role: str, ranks: Sequence[int], world_size: int) -> None:
        """Actors a resize added earlier (found in the state by a restarted PrimeMaster), so a
        later restart recreates them where they belong. A scheduler that cannot resize: nothing."""
        return None

    @abstractmethod
    def stop(self, names: Sequence[str]) -> None:
        """Ask actors to stop, best effort."""

    @abstractmethod
    def cleanup(self) -> None:
        """Remove every actor and placement group of the job except the PrimeMaster."""
