"""Workloads for auto-scaling on the simulated cluster: what the actors' heartbeats and the
queues would say on a real one, as a function of the role's size and the time.

- `ElasticSteps`: a data-parallel role with a fixed global batch; one step takes
  compute_s / N + comm_s * (N - 1) at N nodes (more nodes: less compute each, more
  communication), so its best size can lie strictly inside MIN:MAX. Its ranks share the step.
- `BurstyQueue`: a queue a backlog role drains, `rate_per_actor` items/s per actor, fed by a
  producer whose rate follows `produce(t)`.
"""

from __future__ import annotations

from collections.abc import Callable

from dlu_api.vocabulary import ActorStage
from dlu_prime.autoscale.feed import QueueView
from dlu_prime.master.state import SUB_MASTER_RANK, ChannelRecord, JobState
from dlu_prime.testing.sim_scheduler import SimScheduler


def step_time(nodes: int, compute_s: float, comm_s: float) -> float:
    return compute_s / nodes + comm_s * (nodes - 1)


class ElasticSteps:
    def __init__(self, role: str, compute_s: float, comm_s: float) -> None:
        self.role = role
        self.compute_s = compute_s
        self.comm_s = comm_s
        self.progress = 0.0

    def nodes(self, state: JobState, cluster: SimScheduler) -> list[str]:
        return [
            n
            for n, a in state.actors.items()
            if a.role == self.role
            and a.rank != SUB_MASTER_RANK
            and cluster.stages.get(n) is ActorStage.RUNNING
        ]

    def advance(self, state: JobState, cluster: SimScheduler, dt: float) -> int:
        """`dt` seconds of training at the role's node count now; returns that count."""
        ranks = self.nodes(state, cluster)
        per = state.spec.role(self.role).per_group
        nodes = len({state.actors[n].rank // per for n in ranks})
        if nodes:
            self.progress += dt / step_time(nodes, self.compute_s, self.comm_s)
        others = {
            n: cluster.steps.get(n, 0) + 1 for n, s in cluster.stages.items() if s is ActorStage.RUNNING
        }
        cluster.beat_steps({**others, **dict.fromkeys(ranks, int(self.progress))})
        return nodes


class BurstyQueue:
    def __init__(
        self, name: str, role: str, rate_per_actor: float, produce: Callable[[float], float]
    ) -> None:
        self.name = name
        self.role = role
        self.rate_per_actor = rate_per_actor
        self.produce = produce
        self.backlog = 0.0
        self.done = 0.0
        self.arrived = 0.0
        self.record = ChannelRecord(name=name, kind="channel", actor_name=f"sim.channel.{name}")

    def advance(self, state: JobState, cluster: SimScheduler, t: float, dt: float) -> int:
        """`dt` seconds of producing and draining; returns the actors draining it."""
        actors = [
            n
            for n, a in state.actors.items()
            if a.role == self.role and cluster.stages.get(n) is ActorStage.RUNNING
        ]
        self.backlog += self.produce(t) * dt
        self.arrived += self.produce(t) * dt
        taken = min(self.backlog, len(actors) * self.rate_per_actor * dt)
        self.backlog -= taken
        self.done += taken
        cluster.beat_steps(
            {n: cluster.steps.get(n, 0) + 1 for n, s in cluster.stages.items() if s is ActorStage.RUNNING}
        )
        return len(actors)

    def fixed(self, actors: int, seconds: float, dt: float = 1.0) -> list[tuple[float, float, float]]:
        """The same producer drained by a fixed number of actors: (t, arrived, done) per step."""
        backlog = arrived = done = 0.0
        out: list[tuple[float, float, float]] = []
        t = 0.0
        while t < seconds:
            backlog += self.produce(t) * dt
            arrived += self.produce(t) * dt
            taken = min(backlog, actors * self.rate_per_actor * dt)
            backlog -= taken
            done += taken
            out.append((t, arrived, done))
            t += dt
        return out

    def view(self) -> QueueView:
        return QueueView(self.name, int(self.backlog), int(self.done))
