"""What a job and the Brain say to each other (JSON on the wire, validated on both sides)."""

from __future__ import annotations

import hashlib
import json
from typing import TYPE_CHECKING, Literal

from pydantic import BaseModel, ConfigDict, Field

if TYPE_CHECKING:
    from dlu_api.spec.models import JobSpec, Resources

SampleKind = Literal["throughput", "resource", "backlog"]


class WireModel(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class RoleShape(WireModel):
    """A role as the Brain sizes it: its kind, its bounds and the size it starts with."""

    kind: str
    size: int = Field(ge=0)
    min_size: int = Field(ge=0)
    max_size: int = Field(ge=0)
    elastic: bool = Field(default=False, description="Sized in nodes (nnodes MIN:MAX), else in actors.")
    actors_per_unit: int = Field(
        default=1, ge=1, description="Actors per node of an elastic role; 1 otherwise."
    )
    actor_resources: dict[str, float] = Field(
        default_factory=dict[str, float],
        description="What one actor asks Ray for (CPU, GPU, memory bytes, ...).",
    )


class JobRegistration(WireModel):
    name: str = Field(min_length=1, max_length=200)
    run_id: str = Field(min_length=1, max_length=100)
    roles: dict[str, RoleShape]
    entrypoint: str
    config_hash: str = Field(max_length=64)
    marginal_threshold: float | None = Field(
        default=None,
        gt=0,
        le=1,
        allow_inf_nan=False,
        description="The spec's autoscale.marginal_threshold: the Brain plans this job's elastic "
        "roles with it. None (a job from before it was sent): the Brain's own setting.",
    )
    backlog_target_s: float | None = Field(
        default=None,
        gt=0,
        allow_inf_nan=False,
        description="The spec's autoscale.backlog_target_s, sent by a job with backlog roles: the "
        "Brain sizes them to drain their backlog in this many seconds. None: the Brain's own.",
    )

    @property
    def signature(self) -> str:
        """Same roles (kinds and bounds), entrypoint and config: the same job for the Brain's history.
        Not the threshold nor the backlog target: what a size measured does not depend on them,
        each run judges it by its own."""
        shape = {name: [r.kind, r.min_size, r.max_size, r.elastic] for name, r in sorted(self.roles.items())}
        text = json.dumps([shape, self.entrypoint, self.config_hash], sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:32]


class StatSample(WireModel):
    """One runtime statistics sample: a role's speed at a world size, an actor's resource use, or
    a data channel's (shard queue's) backlog. `seq` numbers a job's samples, so a batch sent
    again after a lost answer is stored once."""

    seq: int = Field(default=0, ge=0)
    time: float
    kind: SampleKind
    role: str | None = None
    world_size: int | None = Field(default=None, ge=0)
    steps_per_s: float | None = Field(default=None, ge=0)
    samples_per_s: float | None = Field(default=None, ge=0)
    actor: str | None = None
    node_id: str | None = None
    cpu_percent: float | None = Field(default=None, ge=0)
    memory_bytes: int | None = Field(default=None, ge=0)
    memory_limit_bytes: int | None = Field(default=None, ge=0)
    gpu_percent: float | None = Field(default=None, ge=0)
    gpu_memory_bytes: int | None = Field(default=None, ge=0)
    channel: str | None = None
    backlog: int | None = Field(default=None, ge=0)


class StatsBatch(WireModel):
    run_id: str
    samples: list[StatSample]


class JobEnd(WireModel):
    run_id: str
    outcome: str = Field(max_length=40)


class RolePlan(WireModel):
    """The Brain's plan for one role: a size (actors, or nodes for an elastic role) and/or the
    memory its actors get, with the algorithm that chose it and why."""

    role: str
    size: int | None = None
    memory_bytes: int | None = None
    algorithm: str
    reason: str
    state: str = "proposed"
    time: float = 0.0
    id: int | None = None


class JobPlan(WireModel):
    job: str
    run_id: str | None = None
    roles: list[RolePlan] = Field(default_factory=list[RolePlan])


class PlanOutcome(WireModel):
    """What the job did with a plan: applied, or unplaceable (with Ray's reason)."""

    run_id: str
    plan_id: int
    state: Literal["applied", "unplaceable"]
    reason: str = ""


def registration_from_spec(spec: JobSpec, run_id: str) -> JobRegistration:
    """The Brain's view of a job spec (sizes in nodes for elastic roles, actors otherwise)."""
    roles: dict[str, RoleShape] = {}
    for role in spec.roles:
        elastic = role.elastic
        if elastic is not None:
            per_node = max(1, role.per_group)
            nodes = max(1, role.total // per_node)
            low, high = elastic.min_nodes, elastic.max_nodes
            roles[role.name] = RoleShape(
                kind=str(role.kind),
                size=nodes,
                min_size=low,
                max_size=high,
                elastic=True,
                actors_per_unit=per_node,
                actor_resources=_asks(role.resources),
            )
        else:
            high = role.max_total or role.total
            roles[role.name] = RoleShape(
                kind=str(role.kind),
                size=role.total,
                min_size=1,
                max_size=high,
                actor_resources=_asks(role.resources),
            )
    entry = " ".join(sorted({r.entrypoint for r in spec.roles}))
    config = json.dumps(spec.config, sort_keys=True, default=str)
    return JobRegistration(
        name=spec.name,
        run_id=run_id,
        roles=roles,
        entrypoint=entry,
        config_hash=hashlib.sha256(config.encode()).hexdigest()[:32],
        marginal_threshold=spec.autoscale.marginal_threshold,
        # only a job with backlog roles has a use for it (nor a warning from an older Brain)
        backlog_target_s=spec.autoscale.backlog_target_s if spec.autoscale.backlog_roles else None,
    )


def _asks(resources: Resources) -> dict[str, float]:
    out: dict[str, float] = {
        "CPU": resources.cpu,
        "GPU": resources.gpu or 0.0,
        "memory": float(resources.memory),
    }
    out.update(resources.custom)
    return {k: v for k, v in out.items() if v}
