"""One administrator per running job: it watches the job's statistics and raises optimize events.

Pure: `observe` takes samples and returns the events to raise; `resume` rebuilds the state from
what the database holds (samples and events), so a restarted Brain carries on where it stopped and
raises no event twice. Events: job_start, throughput_measured (a new world size has enough
measurements), throughput_drop (the speed at the current size fell below `drop_fraction` of the
best seen there), memory_pressure (an actor at `memory_pressure` of its limit), idle_resources
(the cluster has room for a role below its max).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from dlu_prime.brain_port import RoleShape, StatSample


@dataclass(frozen=True)
class AdminSettings:
    min_samples: int = 3  # throughput samples at a world size before it counts as measured
    drop_fraction: float = 0.7
    memory_pressure: float = 0.9


@dataclass(frozen=True)
class Trigger:
    kind: str
    role: str | None
    detail: dict[str, Any]

    @property
    def key(self) -> str:
        """Events with one key are raised once (until the condition clears)."""
        subject = self.detail.get("actor") or self.detail.get("world_size") or ""
        return f"{self.kind}/{self.role}/{subject}"


@dataclass
class JobAdministrator:
    job_id: int
    name: str
    roles: dict[str, RoleShape]
    settings: AdminSettings = field(default_factory=AdminSettings)
    counts: dict[tuple[str, int], int] = field(default_factory=lambda: defaultdict(int))
    best: dict[tuple[str, int], float] = field(default_factory=dict[tuple[str, int], float])
    size_now: dict[str, int] = field(default_factory=dict[str, int])
    # per role, the newest throughput sample by the job's numbering: (seq, world size)
    last_sample: dict[str, tuple[int, int]] = field(default_factory=dict[str, tuple[int, int]])
    raised: set[str] = field(default_factory=set[str])

    def start(self) -> list[Trigger]:
        return self._fresh([Trigger("job_start", None, {"roles": sorted(self.roles)})])

    def observe(self, samples: list[StatSample]) -> list[Trigger]:
        out: list[Trigger] = []
        for s in samples:
            if s.kind == "throughput" and s.role and s.world_size is not None:
                speed = s.samples_per_s or s.steps_per_s
                newest = self.last_sample.get(s.role)
                if speed is not None and (newest is None or s.seq >= newest[0]):
                    self.last_sample[s.role] = (s.seq, s.world_size)
                out.extend(self._throughput(s.role, s.world_size, speed))
            elif s.kind == "resource" and s.memory_bytes and s.memory_limit_bytes:
                out.extend(self._memory(s))
        return self._fresh(out)

    def idle(self, available: dict[str, float], sizes: dict[str, int] | None = None) -> list[Trigger]:
        """Roles below their max for which the free resources hold one more unit (`sizes`: the
        size each role runs at, as the Brain knows it; else the size of its last sample)."""
        out: list[Trigger] = []
        for role, shape in sorted(self.roles.items()):
            size = (sizes or {}).get(role, self.size_now.get(role, shape.size))
            ask = {k: v * shape.actors_per_unit for k, v in shape.actor_resources.items()}
            fits = all(available.get(k, 0.0) >= v for k, v in ask.items())
            key_detail = {"size": size}
            if size < shape.max_size and fits:
                out.append(Trigger("idle_resources", role, {**key_detail, "available": available}))
            else:
                self.raised.discard(f"idle_resources/{role}/")
        return self._fresh(out)

    def resume(self, samples: list[StatSample], raised_keys: list[str]) -> None:
        """Rebuild from the database: every sample seen again, no event raised twice."""
        self.raised.update(raised_keys)
        self.raised.add("job_start/None/")
        self.observe(samples)

    # -- conditions -------------------------------------------------------------------------
    def _throughput(self, role: str, size: int, speed: float | None) -> list[Trigger]:
        if speed is None:
            return []
        key = (role, size)
        previous = self.size_now.get(role)
        self.size_now[role] = size
        if previous is not None and previous != size:
            self.raised.discard(f"throughput_drop/{role}/{size}")
        self.counts[key] += 1
        best = self.best.get(key, 0.0)
        out: list[Trigger] = []
        if self.counts[key] == self.settings.min_samples:
            out.append(Trigger("throughput_measured", role, {"world_size": size, "samples_per_s": speed}))
        if self.counts[key] > self.settings.min_samples and speed < self.settings.drop_fraction * best:
            out.append(
                Trigger("throughput_drop", role, {"world_size": size, "samples_per_s": speed, "best": best})
            )
        elif speed >= self.settings.drop_fraction * best:
            self.raised.discard(f"throughput_drop/{role}/{size}")
        self.best[key] = max(best, speed)
        return out

    def _memory(self, s: StatSample) -> list[Trigger]:
        assert s.memory_bytes is not None and s.memory_limit_bytes is not None
        trigger = Trigger(
            "memory_pressure",
            s.role,
            {"actor": s.actor, "memory_bytes": s.memory_bytes, "memory_limit_bytes": s.memory_limit_bytes},
        )
        if s.memory_bytes >= self.settings.memory_pressure * s.memory_limit_bytes:
            return [trigger]
        self.raised.discard(trigger.key)
        return []

    def _fresh(self, triggers: list[Trigger]) -> list[Trigger]:
        out: list[Trigger] = []
        for trigger in triggers:
            if trigger.key not in self.raised:
                self.raised.add(trigger.key)
                out.append(trigger)
        return out


def size_now(start: int, last_sample: tuple[int, int] | None, applied: tuple[int | None, int] | None) -> int:
    """The size a role runs at, from what the Brain stored: the later of its last throughput
    sample (seq, world size) and the last plan the job answered as applied (the newest sample seq
    the Brain held when that answer came, size). A sample numbered after the answer was measured
    after it; otherwise the plan is newer (the job sends a speed only once measured at a size, so
    it has sent none at the planned size yet). An answer of unknown order (None: stored before the
    Brain recorded it) loses to any sample. `start`: the registration's size, when neither is known."""
    if applied is None:
        return start if last_sample is None else last_sample[1]
    after, planned = applied
    if last_sample is None:
        return planned
    seq, measured = last_sample
    return measured if after is None or seq > after else planned
