"""Fakes for driving the PrimeManager with no Ray: a scriptable in-memory scheduler, a settable
clock, and a state store that records every write.

The fake scheduler reads the stored document back from the store on every call, so a test can
prove that the manager saved a decision *before* acting on it (DESIGN section 4, tier 6).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pytest

from dlu_api.spec import spec_from_dict
from dlu_api.spec.models import JobSpec
from dlu_api.status import JobStage
from dlu_api.vocabulary import ActorStage
from dlu_prime.master.manager import PrimeManager, new_state
from dlu_prime.master.state import JobState
from dlu_prime.scheduler.base import ActorObservation, ActorSetupError, Scheduler
from dlu_prime.scheduler.placement import plan_placement
from dlu_prime.state.memory import MemoryStateStore

START_TIME = 1_000.0


class FakeClock:
    """A clock the test moves by hand: `clock()` returns the current fake time."""

    def __init__(self, now: float = START_TIME) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def set(self, now: float) -> None:
        self.now = now

    def advance(self, seconds: float) -> float:
        self.now += seconds
        return self.now


@dataclass(frozen=True)
class Put:
    """One successful write to the RecordingStore."""

    job: str
    token: int
    stage: JobStage
    run_id: str


class RecordingStore(MemoryStateStore):
    """The in-memory store, plus a log of every successful compare-and-set."""

    def __init__(self) -> None:
        super().__init__()
        self.puts: list[Put] = []

    def put(self, job: str, data: bytes, token: int | None) -> int:
        new_token = super().put(job, data, token)
        state = JobState.loads(data)
        self.puts.append(Put(job, new_token, state.stage, state.run_id))
        return new_token

    def state(self, job: str) -> JobState | None:
        """The stored document of `job`, parsed."""
        stored = self.get(job)
        return JobState.loads(stored.data) if stored is not None else None

    def token(self, job: str) -> int | None:
        stored = self.get(job)
        return stored.token if stored is not None else None


@dataclass(frozen=True)
class Call:
    """One call the manager made on the fake scheduler, with what the store held at that moment."""

    method: str
    names: tuple[str, ...]
    time: float
    token: int | None
    stored: JobState | None

    @property
    def stored_stage(self) -> JobStage | None:
        return self.stored.stage if self.stored is not None else None


@dataclass
class FakeActor:
    """What the fake cluster knows of one actor; `stage is None` means it is gone."""

    name: str
    role: str
    rank: int
    node_id: str | None
    stage: ActorStage | None = ActorStage.INIT
    error: str | None = None
    last_heartbeat: float | None = None
    step: int = 0
    reported_errors: tuple[str, ...] = ()
    reconstructed: bool = False
    unavailable: bool = False
    beats: int = 0
    watched: bool = False
    steps_reported: bool = False
    incarnation: int = 0  # bumped when "Ray rebuilds" it: which process answers

    def beat(self, now: float) -> None:
        self.last_heartbeat = now
        self.beats += 1
        self.watched = True

    def observe(self) -> ActorObservation:
        if self.unavailable:
            return ActorObservation.restarting(f"actor {self.name} is restarting")
        if self.stage is None:
            return ActorObservation.gone(self.error or f"actor {self.name} died")
        return ActorObservation(
            stage=self.stage,
            error=self.error,
            node_id=self.node_id,
            last_heartbeat=self.last_heartbeat,
            step=self.step,
            reported_errors=self.reported_errors,
            reconstructed=self.reconstructed,
            beats=self.beats,
            watched=self.watched,
            steps_reported=self.steps_reported or self.step > 0,
            incarnation=f"{self.node_id}/{self.incarnation}",
        )


Update = ActorStage | Mapping[str, Any]
"""A scripted change: a new stage, or FakeActor fields to set (`{"stage": None}` = gone)."""

Hook = Callable[["FakeScheduler"], None]

METHODS = (
    "prepare",
    "setup",
    "check_children",
    "start",
    "poll",
    "restart",
    "call",
    "stop",
    "cleanup",
    "set_memory",
)


class FakeScheduler(Scheduler):
    """An in-memory scheduler the test scripts.

    - `script(step1, step2, ...)`: step k is applied at the k-th poll (1-based), before the poll
      answers; a step maps an actor name, a role name or "*" to an `Update`. After the script
      ends the actors keep their last values.
    - `fail_with[method] = exc`: that method raises `exc` (after recording the call).
    - `setup_failures[actor] = error`: `setup` raises ActorSetupError for the first such actor.
    - `on(method, hook)`: run `hook(self)` inside that method, after recording the call.
    - `tick`: seconds the fake clock advances at each poll (monitor passes take time).
    - `heartbeats`: RUNNING actors heartbeat at every poll (at the fake clock's time).
    - `calls`: every call, with the stored document and token at the time of the call.
    """

    def __init__(self, spec: JobSpec, store: RecordingStore, clock: FakeClock) -> None:
        self.spec = spec
        self.store = store
        self.clock = clock
        # Every actor the manager tracks (workers and SubMasters); workers sit on node-<node rank>.
        nodes = {plan.name: f"node-{plan.node_rank}" for plan in plan_placement(spec).actors}
        self.actors: dict[str, FakeActor] = {
            name: FakeActor(name, record.role, record.rank, nodes.get(name, "node-0"))
            for name, record in new_state(spec).actors.items()
        }
        self.calls: list[Call] = []
        self.fail_with: dict[str, BaseException] = {}
        self.setup_failures: dict[str, str] = {}
        self.hooks: dict[str, list[Hook]] = {}
        self.steps: list[Mapping[str, Update]] = []
        self.tick = 0.0
        self.heartbeats = False
        self.polls = 0
        self.stopped: list[str] = []
        self.cleaned_up = False
        self.manager: PrimeManager | None = None  # SubMaster calls (failover) call back into it
        self.restart_failures: dict[str, str] = {}
        self.dead: set[str] = set()  # nodes the "cluster" marks dead
        self.call_timeouts: list[float | None] = []

    # scripting ---------------------------------------------------------------------------------
    def names_of(self, role: str) -> list[str]:
        return [a.name for a in self.actors.values() if a.role == role]

    def _targets(self, target: str) -> list[str]:
        if target == "*":
            return list(self.actors)
        if target in self.actors:
            return [target]
        names = self.names_of(target)
        if not names:
            raise KeyError(f"no actor or role {target!r} in the fake scheduler")
        return names

    def set(self, target: str, update: Update) -> None:
        """Change actors now: `target` is an actor name, a role name or "*"."""
        fields: Mapping[str, Any] = {"stage": update} if isinstance(update, ActorStage) else update
        for name in self._targets(target):
            actor = self.actors[name]
            for key, value in fields.items():
                if not hasattr(actor, key):
                    raise AttributeError(f"FakeActor has no field {key!r}")
                setattr(actor, key, value)

    def script(self, *steps: Mapping[str, Update]) -> FakeScheduler:
        self.steps = list(steps)
        return self

    def on(self, method: str, hook: Hook) -> FakeScheduler:
        if method not in METHODS:
            raise ValueError(f"unknown method {method!r}")
        self.hooks.setdefault(method, []).append(hook)
        return self

    # records -----------------------------------------------------------------------------------
    def methods(self) -> list[str]:
        return [c.method for c in self.calls]

    def calls_to(self, method: str) -> list[Call]:
        return [c for c in self.calls if c.method == method]

    def only_call(self, method: str) -> Call:
        found = self.calls_to(method)
        assert len(found) == 1, f"expected one call to {method}, got {self.methods()}"
        return found[0]

    def _enter(self, method: str, names: Iterable[str] = ()) -> None:
        stored = self.store.get(self.spec.name)
        self.calls.append(
            Call(
                method=method,
                names=tuple(names),
                time=self.clock(),
                token=stored.token if stored is not None else None,
                stored=JobState.loads(stored.data) if stored is not None else None,
            )
        )
        for hook in self.hooks.get(method, []):
            hook(self)
        error = self.fail_with.get(method)
        if error is not None:
            raise error

    # the Scheduler contract ------------------------------------------------------------------------
    def prepare(self) -> dict[str, str | None]:
        self._enter("prepare")
        return {name: actor.node_id for name, actor in self.actors.items()}

    def setup(self, names: Sequence[str]) -> None:
        self._enter("setup", names)
        for name in names:
            if name in self.setup_failures:
                self.actors[name].stage = ActorStage.FAILED
                raise ActorSetupError(name, self.setup_failures[name])
            self.actors[name].stage = ActorStage.READY

    def check_children(self, names: Sequence[str]) -> None:
        self._enter("check_children", names)

    def start(self, names: Sequence[str]) -> None:
        self._enter("start", names)
        for name in names:
            actor = self.actors[name]
            if actor.stage is ActorStage.READY:
                actor.stage = ActorStage.RUNNING
                if self.heartbeats:
                    actor.beat(self.clock())

    def poll(self, names: Sequence[str]) -> dict[str, ActorObservation]:
        self.polls += 1
        if self.tick:
            self.clock.advance(self.tick)
        self._enter("poll", names)
        if self.polls <= len(self.steps):
            for target, update in self.steps[self.polls - 1].items():
                self.set(target, update)
        if self.heartbeats:
            for actor in self.actors.values():
                if actor.stage is ActorStage.RUNNING:
                    actor.beat(self.clock())
        return {name: self.actors[name].observe() for name in names}

    def restart(self, names: Sequence[str]) -> dict[str, str | None]:
        self._enter("restart", names)
        for name in names:
            if name in self.restart_failures:
                raise ActorSetupError(name, self.restart_failures[name])
        for name in names:
            actor = self.actors[name]
            actor.stage = ActorStage.READY
            actor.reconstructed = False
            actor.unavailable = False
            actor.reported_errors = ()
            actor.error = None
            actor.node_id = f"node-after-restart-{name}"
            actor.incarnation += 1
        return {name: f"node-after-restart-{name}" for name in names}

    def set_memory(self, memory: Mapping[str, int]) -> None:
        self._enter("set_memory", (f"{name}={amount}" for name, amount in sorted(memory.items())))

    def set_seats(self, seats: Mapping[str, str | None]) -> None:
        self._enter("set_seats", (f"{name}={seat}" for name, seat in sorted(seats.items())))

    def call(self, name: str, method: str, *args: Any, timeout_s: float | None = None) -> Any:
        """SubMaster calls: `failover` restarts through the manager then starts, as the default
        SubMaster does; `recover_running` puts the SubMaster back to RUNNING."""
        self._enter("call", (name, method))
        self.call_timeouts.append(timeout_s)
        if method == "failover":
            names, reason = args
            assert self.manager is not None, "set scheduler.manager to let SubMasters call back"
            self.manager.restart_actors(list(names), reason)
            self.start(list(names))
        elif method == "recover_running":
            self.actors[name].stage = ActorStage.RUNNING
        return None

    def dead_nodes(self, node_ids: Sequence[str]) -> set[str]:
        return self.dead & set(node_ids)

    def stop(self, names: Sequence[str]) -> None:
        self._enter("stop", names)
        self.stopped.extend(names)

    def cleanup(self) -> None:
        self._enter("cleanup")
        self.cleaned_up = True


# spec builders ---------------------------------------------------------------------------------
def role(name: str, total: int = 1, **extra: Any) -> dict[str, Any]:
    """A simple CPU role running `pkg.<name>:main`."""
    return {"name": name, "entrypoint": f"pkg.{name}:main", "total": total, **extra}


def build_spec(
    roles: Sequence[Mapping[str, Any]] | None = None,
    *,
    name: str = "job",
    health: Mapping[str, Any] | None = None,
    **extra: Any,
) -> JobSpec:
    """A valid CPU job (no GPUs); the monitor interval is 1 ms so run() never waits long."""
    return spec_from_dict(
        {
            "name": name,
            "device_type": "CPU",
            "device_per_node": 0,
            "roles": [dict(r) for r in roles] if roles is not None else [role("trainer", 2)],
            "health": {"monitor_interval_s": 0.001, **(health or {})},
            **extra,
        }
    )


SpecFactory = Callable[..., JobSpec]
RoleFactory = Callable[..., dict[str, Any]]
SchedulerFactory = Callable[[JobSpec], FakeScheduler]
ManagerFactory = Callable[..., tuple[PrimeManager, FakeScheduler]]


# fixtures --------------------------------------------------------------------------------------
@pytest.fixture
def fake_clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def store() -> RecordingStore:
    return RecordingStore()


@pytest.fixture
def make_role() -> RoleFactory:
    return role


@pytest.fixture
def make_spec() -> SpecFactory:
    return build_spec


@pytest.fixture
def fake_scheduler_factory(store: RecordingStore, fake_clock: FakeClock) -> SchedulerFactory:
    def factory(spec: JobSpec) -> FakeScheduler:
        return FakeScheduler(spec, store, fake_clock)

    return factory


@pytest.fixture
def make_manager(
    store: RecordingStore, fake_clock: FakeClock, fake_scheduler_factory: SchedulerFactory
) -> ManagerFactory:
    """`make_manager(spec=None, **build_spec_kwargs)`: PrimeManager.create with a fresh fake
    scheduler, the shared store and the fake clock."""

    def factory(spec: JobSpec | None = None, **spec_kwargs: Any) -> tuple[PrimeManager, FakeScheduler]:
        spec = spec if spec is not None else build_spec(**spec_kwargs)
        scheduler = fake_scheduler_factory(spec)
        manager = PrimeManager.create(spec, scheduler, store, clock=fake_clock)
        scheduler.manager = manager
        return manager, scheduler

    return factory
