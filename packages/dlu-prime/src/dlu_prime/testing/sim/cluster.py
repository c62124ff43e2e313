"""A simulated cluster for the simulation: `SimScheduler` plus what goes wrong on a real one.

- Ray reconstructs a killed actor: it is seen again at once as reconstructed and INIT (its
  process is new and not set up), until the PrimeManager replaces or sets it up.
- A lost node takes every actor on it; `dead_nodes` says so, and nothing is placed there again
  (replacements and added actors go to fresh nodes).
- An elastic role's SubMaster answers `failover` by calling back `restart_actors` (as the real
  ElasticMaster does) and starting the replaced ranks, `check_nodes` and `resize_members` as
  the resize needs; one that is dead or being rebuilt fails the call.
- Every scheduler call ticks the crash point, so the PrimeMaster can die inside any of them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any

from dlu_api.spec.models import JobSpec
from dlu_api.vocabulary import ActorStage
from dlu_prime.naming import actor_name
from dlu_prime.scheduler.base import ActorObservation, ActorSetupError
from dlu_prime.testing.sim.clock import SimClock
from dlu_prime.testing.sim.crash import CrashPoint
from dlu_prime.testing.sim_scheduler import SimScheduler

Hook = Callable[[str, Sequence[str]], None]
"""(what, actor names): told of each restart, failover call and resize re-form."""


class SimCluster(SimScheduler):
    def __init__(
        self, spec: JobSpec, clock: SimClock, crash: CrashPoint, sub_masters: Mapping[str, str]
    ) -> None:
        super().__init__(spec, clock, sub_masters)
        self.crash = crash
        self.sub_masters = dict(sub_masters)  # SubMaster -> its role
        self.dead: set[str] = set()
        self.reconstructed: set[str] = set()
        self.fresh_nodes = 0
        self.checks: list[tuple[str, tuple[int, ...]]] = []  # (SubMaster, ranks) of check_nodes
        self.restart_actors: Callable[[list[str], str], None] | None = None
        """The current PrimeManager's restart_actors (set by the runner at each (re)build)."""
        self.hook: Hook | None = None

    # faults ------------------------------------------------------------------------------------
    def kill_actor(self, name: str) -> None:
        """The actor's process dies; Ray reconstructs it (a new, unset-up process)."""
        if self.stages.get(name) is None:
            return
        self.stages[name] = ActorStage.INIT
        self.steps[name] = 0
        self.reconstructed.add(name)
        self._refresh([name])

    def lose_node(self, node: str) -> list[str]:
        """Every actor on `node` is gone for good; Ray marks the node dead."""
        self.dead.add(node)
        lost = [n for n, at in self.nodes.items() if at == node and self.stages.get(n) is not None]
        for name in lost:
            self.kill(name, f"node {node} lost (simulated)")
        return lost

    def live_nodes(self) -> dict[str, list[str]]:
        out: dict[str, list[str]] = {}
        for name, node in self.nodes.items():
            if self.stages.get(name) is not None and node not in self.dead:
                out.setdefault(node, []).append(name)
        return out

    def finish(self, names: Sequence[str]) -> None:
        """These actors' code returned (training done)."""
        self._set([n for n in names if self.stages.get(n) is ActorStage.RUNNING], ActorStage.FINISH)

    def _fresh_node(self) -> str:
        self.fresh_nodes += 1
        return f"node-new-{self.fresh_nodes:05d}"

    def _refresh(self, names: Any) -> None:
        names = list(names)
        super()._refresh(names)
        for name in names:
            if name in getattr(self, "reconstructed", ()) and name in self._seen:
                self._seen[name] = replace(self._seen[name], reconstructed=True)

    def _tell(self, what: str, names: Sequence[str]) -> None:
        if self.hook is not None:
            self.hook(what, names)

    # the Scheduler contract --------------------------------------------------------------------
    def prepare(self) -> dict[str, str | None]:
        self.crash.maybe_die("prepare")
        return super().prepare()

    def setup(self, names: Sequence[str]) -> None:
        self.crash.maybe_die("setup")
        self.reconstructed.difference_update(names)
        super().setup(names)

    def start(self, names: Sequence[str]) -> None:
        """A SubMaster started starts its role's ranks (as the ElasticMaster's `start` does)."""
        self.crash.maybe_die("start")
        roles = {self.sub_masters[n] for n in names if n in self.sub_masters}
        prefixes = tuple(f"{self.spec.name}.{role}." for role in roles)
        ranks = [n for n in self.stages if prefixes and n.startswith(prefixes) and n not in self.sub_masters]
        super().start([*names, *ranks])

    def poll(self, names: Sequence[str]) -> dict[str, ActorObservation]:
        self.crash.maybe_die("poll")
        seen = self._seen
        return {n: seen.get(n) or ActorObservation.gone(f"{n} is unknown to Ray") for n in names}

    def restart(self, names: Sequence[str]) -> dict[str, str | None]:
        self.crash.maybe_die("restart")
        self._tell("restart", names)
        moved: dict[str | None, str] = {}  # a lost node's actors go to one new node together
        for name in names:
            if self.nodes.get(name) in self.dead or name not in self.nodes:
                self.nodes[name] = moved.setdefault(self.nodes.get(name), self._fresh_node())
            self.stages.setdefault(name, ActorStage.INIT)
            self.steps.setdefault(name, 0)
        self.reconstructed.difference_update(names)
        return super().restart(names)

    def dead_nodes(self, node_ids: Sequence[str]) -> set[str]:
        return self.dead & set(node_ids)

    def call(self, name: str, method: str, *args: Any, timeout_s: float | None = None) -> Any:
        self.crash.maybe_die(f"call {method}")
        if self.stages.get(name) is None or name in self.reconstructed:
            raise ActorSetupError(name, f"actor {name} died (simulated)")
        if method == "failover":
            names, reason = list(args[0]), str(args[1])
            self._tell("failover", names)
            assert self.restart_actors is not None, "the runner sets restart_actors"
            self.restart_actors(names, reason)
            self.start(names)
            return None
        if method == "check_nodes":
            self.checks.append((name, tuple(args[0])))
            return None
        if method == "resize_members":
            ranks, new_ranks = list(args[0]), list(args[1])
            new = [n for n, _ in self._rank_names(self.sub_masters[name], new_ranks)]
            self._tell("resize_members", new)
            self.start(new)
            return len(ranks)
        return super().call(name, method, *args, timeout_s=timeout_s)

    def _rank_names(self, role: str, ranks: Sequence[int]) -> list[tuple[str, int]]:
        return [(actor_name(self.spec.name, role, r), r) for r in ranks]

    def add_actors(self, role: str, ranks: Sequence[int], world_size: int) -> dict[str, str | None]:
        """New actors on fresh nodes, one per node group (an elastic node's ranks share one, as
        its placement group does on Ray)."""
        self.crash.maybe_die("add_actors")
        per = self.spec.role(role).per_group
        fresh = {
            name
            for name in (actor_name(self.spec.name, role, r) for r in ranks)
            if self.stages.get(name) is None
        }
        out = super().add_actors(role, ranks, world_size)
        groups: dict[int, str] = {}
        for name, rank in zip(out, ranks, strict=True):
            if name in fresh:
                self.nodes[name] = groups.setdefault(rank // per, self._fresh_node())
        self._refresh(list(out))
        return {name: self.nodes[name] for name in out}

    def remove_actors(self, names: Sequence[str]) -> None:
        self.crash.maybe_die("remove_actors")
        super().remove_actors(names)

    def drop_actors(self, names: Sequence[str]) -> None:
        self.crash.maybe_die("drop_actors")
        super().remove_actors(names)

    def stop(self, names: Sequence[str]) -> None:
        self.crash.maybe_die("stop")
        super().stop(names)

    def cleanup(self) -> None:
        self.crash.maybe_die("cleanup")
        super().cleanup()
