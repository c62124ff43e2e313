"""The runtime statistics a PrimeMaster holds, fed by its monitoring passes: each role's speed at
each world size (from the steps its actors' heartbeats carry), each actor's CPU and memory (the
actor measures its own processes with psutil; the poll carries them), and the backlog of each
data channel and shard queue with how fast its backlog role drains it.

Pure but for the memory it keeps: every method takes the state and the time. Nothing is
measured while a resize or a recovery is in flight, nor for `settle_s` after one ended (the new
world warms up: its first steps are not its speed).
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass

from dlu_api.spec.models import RoleKind
from dlu_api.status import JobStage
from dlu_api.vocabulary import ActorStage
from dlu_prime.autoscale import memory
from dlu_prime.autoscale.memory import MemoryView
from dlu_prime.autoscale.policy import RoleView
from dlu_prime.brain_port.models import StatSample
from dlu_prime.master.elastic_policy import role_nodes
from dlu_prime.master.state import SUB_MASTER_RANK, JobState, role_size
from dlu_prime.scheduler.base import ActorObservation
from dlu_prime.stats.resources import backlog_sample
from dlu_prime.stats.throughput import ThroughputMeter

SAMPLED = 16  # actors per role whose steps are measured
USAGE_S = 5.0  # the actors' resource use is taken at most this often


@dataclass(frozen=True)
class QueueView:
    """A data channel (`backlog`: items queued, `done`: delivered so far) or a shard queue
    (shards to do, shards done) as its actor last answered."""

    name: str
    backlog: int
    done: int


@dataclass(frozen=True)
class _High:
    """An actor's consecutive samples at memory pressure: since when, how many, at which limit."""

    limit: int
    since: float
    samples: int


@dataclass
class _Drain:
    items: float = 0.0
    actor_s: float = 0.0  # seconds x actors of its role, while the queue had work


def world_size(state: JobState, role: str) -> int:
    """A role's size as auto-scaling counts it: nodes of an elastic role, else actors."""
    if state.spec.role(role).kind is RoleKind.ELASTIC:
        return len(role_nodes(state, role))
    return role_size(state, role)


def _sample(state: JobState) -> tuple[dict[str, list[str]], dict[str, int]]:
    """Per role, the workers of the lowest ranks (at most SAMPLED): a role's speed is the mean
    of its actors' (the ranks of a data-parallel role share their step); and each role's size.
    A role's ranks are kept as rank -> name (a rank names one actor, `actor_name`), not as a
    pair per actor: at 16,384 actors those pairs were the garbage that ran the collector in the
    pass that follows a recovery."""
    ranks: dict[str, dict[int, str]] = {}
    counts: dict[str, int] = {}
    for name, record in state.actors.items():
        rank, role = record.rank, record.role
        if rank != SUB_MASTER_RANK:
            held = ranks.get(role)
            if held is None:
                held = ranks[role] = {}
            held[rank] = name
            counts[role] = counts.get(role, 0) + 1
    sampled: dict[str, list[str]] = {}
    sizes: dict[str, int] = {}
    for spec in state.spec.roles:
        held = ranks.get(spec.name, {})
        sampled[spec.name] = [held[rank] for rank in heapq.nsmallest(SAMPLED, held)]
        per = max(1, spec.per_group)
        elastic = spec.kind is RoleKind.ELASTIC
        sizes[spec.name] = len({rank // per for rank in held}) if elastic else counts.get(spec.name, 0)
    return sampled, sizes


def _changes(state: JobState) -> tuple[int, ...]:
    """Counts that move with every resize, recovery and memory relaunch: one carried out between
    two passes (it never shows in flight to the pass) still starts a new measurement."""
    roles = [state.roles[name] for name in sorted(state.roles)]
    return (
        state.job_restart_count,
        state.master_restart_count,
        state.relaunch_count,
        *(n for r in roles for n in (r.resize_count, r.restart_count, r.inplace_restart_count)),
        *(r.sub_master_restart_count for r in roles),
    )


class JobStatistics:
    def __init__(self, now: float) -> None:
        self.meter = ThroughputMeter()
        self._usage: dict[str, tuple[str, str | None, float | None, int]] = {}  # role, node, cpu, memory
        self._limits: dict[str, int] = {}  # actor -> the memory it asks Ray for (0: none)
        self._high: dict[str, _High] = {}  # actors at memory pressure now
        self._node_memory: dict[str, int] = {}  # actor -> what its node holds
        self.backlogs: dict[str, int] = {}
        self.changed_at = now  # the last resize or recovery seen (or this PrimeMaster's start)
        self._measured_since: dict[str, float] = {}  # role -> its first measurement since then
        self._mark: tuple[int, ...] = ()
        self._actors = -1
        self._sampled: dict[str, list[str]] = {}  # role -> the actors its speed is measured on
        self._sizes: dict[str, int] = {}  # role -> its world size (nodes of an elastic role)
        self._next_usage = 0.0
        self._simple: set[str] = set()  # roles whose actors work on their own (their speeds add up)
        self._drained_by: dict[str, str] = {}  # queue -> the backlog role draining it
        self._queues: dict[str, tuple[QueueView, float]] = {}
        self._drains: dict[str, _Drain] = {}
        self._arrivals: dict[str, deque[tuple[float, int, float]]] = {}  # (time, items, seconds)

    def usage(self) -> dict[str, StatSample]:
        """Each actor's latest CPU and memory, as resource samples (the memory it asks Ray for the
        limit: its role's, or what a memory relaunch gave it)."""
        return {
            name: StatSample(
                time=0.0,
                kind="resource",
                role=role,
                actor=name,
                node_id=node,
                cpu_percent=cpu,
                memory_bytes=memory,
                memory_limit_bytes=self._limits.get(name) or None,
            )
            for name, (role, node, cpu, memory) in self._usage.items()
        }

    def _size(self, state: JobState, role: str) -> int:
        size = self._sizes.get(role)
        return world_size(state, role) if size is None else size

    def busy(self, state: JobState) -> bool:
        return (
            state.stage is not JobStage.RUNNING
            or state.resize is not None
            or state.failover is not None
            or state.relaunch is not None
        )

    def quiet_for(self, now: float) -> float:
        """Seconds since the last resize or recovery ended (measurements are from after it)."""
        return now - self.changed_at

    def observe(self, state: JobState, observations: Mapping[str, ActorObservation], now: float) -> None:
        """One monitoring pass: the steps of each role's sampled actors, and every USAGE_S the
        resource use of every polled actor. Cheap at any size: a pass of a 16,384-rank job
        touches each actor only when the resource use is due."""
        mark = _changes(state)
        busy = self.busy(state)
        if busy or mark != self._mark or len(state.actors) != self._actors:
            if busy or mark != self._mark:
                self.changed_at = now  # a resize or recovery in flight, or one that ended since
                self._measured_since.clear()
            self._mark, self._actors = mark, len(state.actors)
            self._sampled, self._sizes = _sample(state)
        measuring = not busy and now - self.changed_at >= state.spec.autoscale.settle_s
        for role, names in self._sampled.items():
            for name in names:
                seen = observations.get(name)
                if (
                    not measuring
                    or seen is None
                    or seen.stage is not ActorStage.RUNNING
                    or not (seen.steps_reported or seen.step > 0)
                ):
                    # an elastic rank's agent relays its process's steps without being judged by
                    # them (steps_reported stays False): its step counts all the same
                    self.meter.forget_actor(role, name)  # the next interval starts afresh
                    continue
                if self.meter.observe_step(role, name, seen.step, now, self._sizes[role]):
                    self._measured_since.setdefault(role, now)
        if now < self._next_usage:
            return
        self._next_usage = now + USAGE_S
        asks = {r.name: r.resources.memory for r in state.spec.roles}
        self._simple = {r.name for r in state.spec.roles if r.kind is not RoleKind.ELASTIC}
        self._drained_by = {channel: role for role, channel in state.spec.autoscale.backlog_roles.items()}
        actors = state.actors
        for name, seen in observations.items():
            record = actors.get(name)
            if record is None:
                continue
            limit = record.memory if record.memory is not None else asks.get(record.role, 0)
            self._limits[name] = limit
            if seen.memory_bytes is None:
                self._high.pop(name, None)  # not measured (a new incarnation, say): not sustained
                continue
            self._usage[name] = (record.role, seen.node_id, seen.cpu_percent, seen.memory_bytes)
            if seen.node_memory_bytes:
                self._node_memory[name] = seen.node_memory_bytes
            self._pressure(name, seen.memory_bytes, limit, now)
        for name in [n for n in self._usage if n not in actors]:
            del self._usage[name]
            for kept in (self._limits, self._high, self._node_memory):
                kept.pop(name, None)

    def _pressure(self, name: str, used: int, limit: int, now: float) -> None:
        """Count the actor's consecutive samples at memory pressure; a sample below it, or a new
        limit (a relaunch gave it more), starts again."""
        high = self._high.get(name)
        if limit <= 0 or used < memory.PRESSURE * limit:
            self._high.pop(name, None)
        elif high is None or high.limit != limit:
            self._high[name] = _High(limit, now, 1)
        else:
            self._high[name] = _High(limit, high.since, high.samples + 1)

    def memory_views(self, state: JobState) -> list[MemoryView]:
        """The actors at memory pressure now, as `autoscale.memory` judges them."""
        out: list[MemoryView] = []
        for name, high in sorted(self._high.items()):
            record = state.actors.get(name)
            used = self._usage.get(name)
            if record is None or used is None:
                continue
            out.append(
                MemoryView(
                    actor=name,
                    role=record.role,
                    label=f"{record.role}.{record.rank}",
                    used=used[3],
                    limit=high.limit,
                    since=high.since,
                    samples=high.samples,
                    node_memory=self._node_memory.get(name),
                    raised_at=record.memory_raised_at,
                )
            )
        return out

    def observe_queues(self, state: JobState, views: Mapping[str, QueueView], now: float) -> None:
        """The queues' backlogs; for a backlog role's queue, what its actors drained while the
        queue had work (a queue that runs dry says how fast its producer is, not its consumers)."""
        drained_by = {channel: role for role, channel in state.spec.autoscale.backlog_roles.items()}
        steady = not self.busy(state)
        for name, view in views.items():
            self.backlogs[name] = view.backlog
            before = self._queues.get(name)
            self._queues[name] = (view, now)
            role = drained_by.get(name)
            if before is None or role is None or role not in state.roles or not steady:
                continue
            last, then = before
            if now > then:
                arrived = max(0, (view.backlog - last.backlog) + (view.done - last.done))
                self._arrivals.setdefault(name, deque()).append((now, arrived, now - then))
            actors = role_size(state, role)
            if last.backlog > 0 and view.backlog > 0 and now > then and actors and view.done >= last.done:
                drain = self._drains.setdefault(name, _Drain())
                drain.items += view.done - last.done
                drain.actor_s += (now - then) * actors

    def drain_rate(self, channel: str) -> float | None:
        """Items one actor drains per second while it has work; None until measured."""
        drain = self._drains.get(channel)
        if drain is None or drain.actor_s <= 0:
            return None
        return drain.items / drain.actor_s

    def arrival_rate(self, channel: str, now: float, window_s: float) -> float | None:
        """Items per second put into the queue over the last `window_s`; None until measured."""
        seen = self._arrivals.get(channel)
        if not seen:
            return None
        while seen and seen[0][0] < now - window_s:
            seen.popleft()
        span = sum(dt for _, _, dt in seen)
        return sum(n for _, n, _ in seen) / span if span > 0 else None

    def views(self, state: JobState, now: float) -> list[RoleView]:
        """The auto-scaled roles as the policy sees them: elastic roles with a MIN:MAX range
        that may be resized, and the backlog roles (1..max_total)."""
        settings = state.spec.autoscale
        out: list[RoleView] = []
        for spec in state.spec.roles:
            if not spec.resizable or spec.name not in state.roles:
                continue
            if spec.name in settings.backlog_roles:
                channel = settings.backlog_roles[spec.name]
                out.append(
                    RoleView(
                        spec.name,
                        elastic=False,
                        current=self._size(state, spec.name),
                        low=1,
                        high=spec.max_total or spec.total,
                        backlog=self.backlogs.get(channel),
                        drain_per_actor=self.drain_rate(channel),
                        arrival_per_s=self.arrival_rate(channel, now, settings.measure_s),
                        unit="items/s",
                    )
                )
            elif spec.kind is RoleKind.ELASTIC and spec.elastic is not None:
                low, high = spec.elastic.min_nodes, spec.elastic.max_nodes
                if low < high:
                    by_size = self.meter.by_size(spec.name)
                    since = self._measured_since.get(spec.name)
                    out.append(
                        RoleView(
                            spec.name,
                            True,
                            self._size(state, spec.name),
                            low,
                            high,
                            by_size,
                            "steps/s",
                            measured_s=0.0 if since is None else now - since,
                        )
                    )
        return out

    def take_samples(self, now: float, min_span_s: float = 0.0) -> list[StatSample]:
        """What the Brain is sent each report: each role's speed since the last one, as the
        role's total (a simple role's actors add up; an elastic role's ranks share one step),
        and each actor's and queue's latest resource use and backlog (with the role draining it)."""
        speeds = [
            s.model_copy(update={"steps_per_s": s.steps_per_s * s.world_size})
            if s.role in self._simple and s.steps_per_s is not None and s.world_size
            else s
            for s in self.meter.drain(now, min_span_s)
        ]
        used = [s.model_copy(update={"time": now}) for _, s in sorted(self.usage().items())]
        backlogs = [
            backlog_sample(name, count, now, self._drained_by.get(name), self.drain_rate(name))
            for name, count in sorted(self.backlogs.items())
        ]
        return [*speeds, *used, *backlogs]
