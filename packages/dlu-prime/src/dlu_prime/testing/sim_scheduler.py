"""A simulated cluster for driving a PrimeManager at scale without Ray.

Unlike the scriptable fake of the unit tests, this one is built to cost almost nothing per
actor, so a benchmark of the PrimeManager with 10,000 actors measures the manager and not the
simulation: each actor's observation is built once and reused until the actor changes, and
`poll` only picks the cached observations of the names asked for.

Actors sit on `node-<node rank>` as the placement plan says (so `per_group` actors per node);
a healthy RUNNING actor's heartbeat is the simulation's clock at its last `beat()`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from dlu_api.spec.models import JobSpec
from dlu_api.vocabulary import ActorStage
from dlu_prime.naming import actor_name
from dlu_prime.scheduler.base import ActorObservation, ActorSetupError, Scheduler
from dlu_prime.scheduler.placement import plan_placement

Clock = Callable[[], float]


def node_of(node_rank: int) -> str:
    """The simulated node id of a node rank (fixed width, so ids sort by rank)."""
    return f"node-{node_rank:05d}"


class SimScheduler(Scheduler):
    """Every actor of the job's placement plan (SubMasters on node 0), healthy unless told.

    `kill(name)` makes an actor gone, `fail(name, error)` FAILED, `beat()` refreshes every
    RUNNING actor's heartbeat and advances its step. `setup_errors[name]` makes setup raise.
    """

    def __init__(self, spec: JobSpec, clock: Clock = time.time, actor_names: Iterable[str] = ()) -> None:
        self.spec = spec
        self.clock = clock
        self.nodes: dict[str, str] = {
            plan.name: node_of(plan.node_rank) for plan in plan_placement(spec).actors
        }
        for name in actor_names:  # SubMasters and anything else the manager tracks
            self.nodes.setdefault(name, node_of(0))
        self.stages: dict[str, ActorStage | None] = dict.fromkeys(self.nodes, ActorStage.INIT)
        self.steps: dict[str, int] = dict.fromkeys(self.nodes, 0)
        self.setup_errors: dict[str, str] = {}
        self._seen: dict[str, ActorObservation] = {}
        self._beats: dict[str, int] = {}
        self.polls = 0
        self.cleaned_up = False
        self.added: list[str] = []  # every add_actors / remove_actors call, in order
        self.removed: list[str] = []
        self.memory: dict[str, int] = {}  # actor -> the memory a relaunch gave it (`set_memory`)
        self.seats: dict[str, str] = {}  # actor -> the bundle it was seated in (`set_seats`)
        self.replaced: list[tuple[str, int | None]] = []  # every replacement, with the memory it asked for
        self.memory_used: dict[str, int] = {}  # actor -> the memory it reports using (set by a test)
        self.node_memory: int | None = None  # what every node holds, as the actors report it
        self.held_shards: dict[str, dict[str, list[int]]] = {}
        """Shard queue -> worker -> ids it holds (set by a test); `requeue_shards` hands them back."""
        self._refresh(self.nodes)

    # simulation controls ---------------------------------------------------------------------
    def beat(self, step: int | None = None) -> None:
        """Every RUNNING actor heartbeats now (and moves to `step`, default one step on)."""
        running = [n for n, s in self.stages.items() if s is ActorStage.RUNNING]
        for name in running:
            self.steps[name] = self.steps[name] + 1 if step is None else step
        self._refresh(running)

    def beat_steps(self, steps: Mapping[str, int]) -> None:
        """These RUNNING actors heartbeat now, each at its own step."""
        running = [n for n in steps if self.stages.get(n) is ActorStage.RUNNING]
        for name in running:
            self.steps[name] = steps[name]
        self._refresh(running)

    def kill(self, name: str, error: str = "actor died (simulated)") -> None:
        self.stages[name] = None
        self._seen[name] = ActorObservation.gone(error)

    def last_nodes(self, names: Sequence[str]) -> dict[str, str]:
        return {
            n: node for n in names if self.stages.get(n) is None and (node := self.nodes.get(n)) is not None
        }

    def fail(self, name: str, error: str = "failed (simulated)") -> None:
        self.stages[name] = ActorStage.FAILED
        self._seen[name] = ActorObservation(ActorStage.FAILED, error=error, node_id=self.nodes[name])

    def observations(self) -> dict[str, ActorObservation]:
        """The current observation of every actor (a copy; the simulation keeps its own)."""
        return dict(self._seen)

    def _refresh(self, names: Iterable[str]) -> None:
        now = self.clock()
        for name in names:
            stage = self.stages[name]
            if stage is None:
                continue
            running = stage is ActorStage.RUNNING
            beats = self._beats.get(name, 0) + (1 if running else 0)
            self._beats[name] = beats
            self._seen[name] = ActorObservation(
                stage=stage,
                node_id=self.nodes[name],
                last_heartbeat=now if running else None,
                step=self.steps[name],
                beats=beats,
                watched=running,
                steps_reported=running,
                memory_bytes=self.memory_used.get(name),
                node_memory_bytes=self.node_memory if name in self.memory_used else None,
            )

    def use_memory(self, name: str, used: int) -> None:
        """The actor reports using `used` bytes from its next poll on (a new incarnation: none)."""
        self.memory_used[name] = used
        self._refresh([name])

    def _set(self, names: Iterable[str], stage: ActorStage) -> None:
        changed = [n for n in names if self.stages.get(n) is not None]
        for name in changed:
            self.stages[name] = stage
        self._refresh(changed)

    # the Scheduler contract --------------------------------------------------------------------
    def prepare(self) -> dict[str, str | None]:
        return dict(self.nodes)

    def setup(self, names: Sequence[str]) -> None:
        for name in names:
            if name in self.setup_errors:
                self._set([name], ActorStage.FAILED)
                raise ActorSetupError(name, self.setup_errors[name])
        self._set(names, ActorStage.READY)

    def check_children(self, names: Sequence[str]) -> None:
        return None

    def start(self, names: Sequence[str]) -> None:
        self._set([n for n in names if self.stages.get(n) is ActorStage.READY], ActorStage.RUNNING)

    def poll(self, names: Sequence[str]) -> dict[str, ActorObservation]:
        self.polls += 1
        seen = self._seen
        return {name: seen[name] for name in names}

    def set_memory(self, memory: Mapping[str, int]) -> None:
        for name, amount in memory.items():
            role = next(
                r for r in self.spec.roles if name.startswith(actor_name(self.spec.name, r.name, 0)[:-1])
            )
            if amount == role.resources.memory:
                self.memory.pop(name, None)
            else:
                self.memory[name] = amount

    def set_seats(self, seats: Mapping[str, str | None]) -> None:
        """No bundles here: the seats are kept to be looked at."""
        for name, seat in seats.items():
            if seat is None:
                self.seats.pop(name, None)
            else:
                self.seats[name] = seat

    def restart(self, names: Sequence[str]) -> dict[str, str | None]:
        for name in names:
            self.replaced.append((name, self.memory.get(name)))
            self.memory_used.pop(name, None)
            self.stages[name] = ActorStage.READY
            self.steps[name] = 0
        self._refresh(names)
        return {name: self.nodes[name] for name in names}

    def call(self, name: str, method: str, *args: Any, timeout_s: float | None = None) -> Any:
        """SubMaster calls, as the default SubMaster answers them: a failover replaces and
        starts the named workers; recover_running puts the SubMaster back to RUNNING."""
        if method == "failover":
            names = list(args[0])
            self.restart(names)
            self.start(names)
        elif method == "recover_running":
            self._set([name], ActorStage.RUNNING)
        return None

    def add_actors(self, role: str, ranks: Sequence[int], world_size: int) -> dict[str, str | None]:
        """New actors of a resized role, each on a node of its own rank; set up (READY)."""
        names = [actor_name(self.spec.name, role, rank) for rank in ranks]
        for name, rank in zip(names, ranks, strict=True):
            if self.stages.get(name) is None:  # adopted by name when it exists
                self.nodes[name] = node_of(rank)
                self.stages[name] = ActorStage.INIT
                self.steps[name] = 0
            self.added.append(name)
        self.setup([n for n in names if self.stages[n] is ActorStage.INIT])
        return {name: self.nodes[name] for name in names}

    def remove_actors(self, names: Sequence[str]) -> None:
        for name in names:
            self.nodes.pop(name, None)
            self.stages.pop(name, None)
            self._seen.pop(name, None)
            self.removed.append(name)

    def requeue_shards(self, queues: Sequence[str], workers: Sequence[str]) -> dict[str, list[int]]:
        out: dict[str, list[int]] = {}
        for queue in queues:
            held = self.held_shards.get(queue, {})
            ids = [shard for worker in workers for shard in held.pop(worker, [])]
            if ids:
                out[queue] = ids
        return out

    def stop(self, names: Sequence[str]) -> None:
        self._set([n for n in names if not _terminal(self.stages.get(n))], ActorStage.FINISH)

    def cleanup(self) -> None:
        self.cleaned_up = True


def _terminal(stage: ActorStage | None) -> bool:
    return stage is None or stage.is_terminal
