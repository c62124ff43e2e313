"""Training speed per role and world size, accumulated from heartbeats (steps) and a samples hook.

Pure: every method takes the time. Steps are counted per actor between two of its heartbeats at
the same world size (a resize in between starts a new interval), pooled over the role's actors;
samples are counted by the role between two hook calls at the same world size.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from dlu_prime.brain_port.models import StatSample


@dataclass
class _Pool:
    steps: float = 0.0
    step_time: float = 0.0
    samples: float = 0.0
    sample_time: float = 0.0
    since: float | None = None  # the first and last moment measured
    until: float | None = None

    def add(self, other: _Pool) -> None:
        self.steps += other.steps
        self.step_time += other.step_time
        self.samples += other.samples
        self.sample_time += other.sample_time

    def spans(self, then: float, now: float) -> None:
        self.since = then if self.since is None else min(self.since, then)
        self.until = now if self.until is None else max(self.until, now)

    @property
    def span_s(self) -> float:
        return self.until - self.since if self.since is not None and self.until is not None else 0.0

    @property
    def steps_per_s(self) -> float | None:
        return self.steps / self.step_time if self.step_time > 0 else None

    @property
    def samples_per_s(self) -> float | None:
        return self.samples / self.sample_time if self.sample_time > 0 else None


@dataclass(frozen=True)
class Throughput:
    role: str
    world_size: int
    steps_per_s: float | None
    samples_per_s: float | None


@dataclass
class _RoleMeter:
    last_step: dict[str, tuple[int, float, int]] = field(default_factory=dict[str, tuple[int, float, int]])
    last_samples: tuple[float, int] | None = None
    total: dict[int, _Pool] = field(default_factory=dict[int, _Pool])
    window: dict[int, _Pool] = field(default_factory=dict[int, _Pool])

    def pool(self, size: int) -> tuple[_Pool, _Pool]:
        return self.total.setdefault(size, _Pool()), self.window.setdefault(size, _Pool())


class ThroughputMeter:
    def __init__(self) -> None:
        self._roles: dict[str, _RoleMeter] = {}

    def observe_step(self, role: str, actor: str, step: int, now: float, world_size: int) -> bool:
        """Whether this heartbeat made a measurement (it follows one of the same actor at the
        same world size)."""
        meter = self._roles.setdefault(role, _RoleMeter())
        before = meter.last_step.get(actor)
        meter.last_step[actor] = (step, now, world_size)
        if before is None:
            return False
        last, then, size = before
        if size != world_size or step < last or now <= then:
            return False  # a resize or a restart in between: not a measurement
        # A step that did not move is a measurement too (time, no steps): an elastic rank's agent
        # relays its process's steps in bursts, and dropping the polls between them read 1.9
        # steps/s where the rank ran at 1.4.
        for pool in meter.pool(world_size):
            pool.steps += step - last
            pool.step_time += now - then
            pool.spans(then, now)
        return True

    def observe_samples(self, role: str, count: int, now: float, world_size: int) -> None:
        """`count` samples the role consumed since the previous call (the samples hook)."""
        meter = self._roles.setdefault(role, _RoleMeter())
        before, meter.last_samples = meter.last_samples, (now, world_size)
        if before is None or before[1] != world_size or now <= before[0]:
            return
        for pool in meter.pool(world_size):
            pool.samples += count
            pool.sample_time += now - before[0]
            pool.spans(before[0], now)

    def forget_actor(self, role: str, actor: str) -> None:
        """An actor that left (or restarts): its next heartbeat starts afresh."""
        meter = self._roles.get(role)
        if meter:
            meter.last_step.pop(actor, None)

    def by_size(self, role: str) -> dict[int, float]:
        """Samples/s (steps/s where no samples were counted) at each measured world size."""
        meter = self._roles.get(role)
        if meter is None:
            return {}
        out: dict[int, float] = {}
        for size, pool in meter.total.items():
            speed = pool.samples_per_s if pool.samples_per_s is not None else pool.steps_per_s
            if speed is not None:
                out[size] = speed
        return out

    def summary(self) -> list[Throughput]:
        """Everything measured so far, per role and world size."""
        return [
            Throughput(role, size, pool.steps_per_s, pool.samples_per_s)
            for role, meter in sorted(self._roles.items())
            for size, pool in sorted(meter.total.items())
        ]

    def drain(self, now: float, min_span_s: float = 0.0) -> list[StatSample]:
        """The speed of each role since the previous drain, one sample per world size it ran at.

        A window measured over less than `min_span_s` at the size the role runs at now is kept
        for the next drain: a reader that averages samples (the Brain) would give a few steps
        counted in whole numbers the weight of a full window (one such window after each resize
        read 2.5 steps/s where the role ran at 2.7). One at a size the role has left is sent."""
        out: list[StatSample] = []
        for role, meter in sorted(self._roles.items()):
            current = {size for _, _, size in meter.last_step.values()}
            kept: dict[int, _Pool] = {}
            for size, pool in sorted(meter.window.items()):
                if pool.steps_per_s is None and pool.samples_per_s is None:
                    continue
                if pool.span_s < min_span_s and size in current:
                    kept[size] = pool
                    continue
                out.append(
                    StatSample(
                        time=now,
                        kind="throughput",
                        role=role,
                        world_size=size,
                        steps_per_s=pool.steps_per_s,
                        samples_per_s=pool.samples_per_s,
                    )
                )
            meter.window = kept
        return out
