"""The runtime statistics a job holds, written into the status a client reads (`dlu status`)."""

from __future__ import annotations

from collections.abc import Mapping

from dlu_api.status import ActorStatus, JobStatus, RoleStatus, ThroughputAtSize
from dlu_prime.brain_port.models import StatSample
from dlu_prime.stats.throughput import ThroughputMeter


def with_statistics(
    status: JobStatus,
    meter: ThroughputMeter,
    usage: Mapping[str, StatSample],
    backlogs: Mapping[str, int],
) -> JobStatus:
    """A copy of `status` with each role's speed per world size, each actor's latest resource
    sample (`usage` by actor name) and the channels' backlogs."""
    by_role: dict[str, list[ThroughputAtSize]] = {}
    for t in meter.summary():
        by_role.setdefault(t.role, []).append(ThroughputAtSize(world_size=t.world_size, steps_per_s=t.steps_per_s,
                                                               samples_per_s=t.samples_per_s))  # fmt: skip
    roles: list[RoleStatus] = []
    for role in status.roles:
        actors: list[ActorStatus] = []
        for actor in role.actors:
            used = usage.get(actor.name)
            actors.append(
                actor
                if used is None
                else actor.model_copy(
                    update={
                        "cpu_percent": used.cpu_percent,
                        "memory_bytes": used.memory_bytes,
                        "gpu_percent": used.gpu_percent,
                    }
                )
            )
        roles.append(role.model_copy(update={"actors": actors}))
    return status.model_copy(update={"roles": roles, "throughput": by_role, "backlogs": dict(backlogs)})
