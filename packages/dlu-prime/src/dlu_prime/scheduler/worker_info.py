"""What a worker actor is told about itself (`WorkerInfo`): pure, from the spec and its plan.

A resized role's new actors get the same, with the role's size at the time of the resize as
their world size; the actors that were already running keep what they were given.
"""

from __future__ import annotations

from dlu_api.spec.models import JobSpec
from dlu_prime.scheduler.placement import ActorPlan
from dlu_prime.worker.actor import WorkerInfo


def identity_env(spec: JobSpec, plan: ActorPlan, run_id: str = "") -> dict[str, str]:
    """The rank variables of one worker, as torchrun-style code expects them."""
    return {
        "DLU_JOB": spec.name,
        "DLU_ROLE": plan.role,
        "DLU_ACTOR": plan.name,
        "DLU_RUN_ID": run_id,
        "ROLE_RANK": str(plan.rank),
        "ROLE_WORLD_SIZE": str(plan.world_size),
        "LOCAL_RANK": str(plan.local_rank),
        "LOCAL_WORLD_SIZE": str(plan.local_world_size),
        "GROUP_RANK": str(plan.node_rank),
        "NODE_RANK": str(plan.node_rank),
    }


def worker_info(spec: JobSpec, plan: ActorPlan, workdir: str | None, run_id: str = "") -> WorkerInfo:
    role = spec.role(plan.role)
    return WorkerInfo(
        job=spec.name,
        role=plan.role,
        rank=plan.rank,
        world_size=plan.world_size,
        local_rank=plan.local_rank,
        local_world_size=plan.local_world_size,
        node_rank=plan.node_rank,
        actor_name=plan.name,
        entrypoint=role.entrypoint,
        env={**spec.env, **role.env, **identity_env(spec, plan, run_id)},
        config=dict(spec.config),
        workdir=workdir,
        role_sizes={r.name: plan.world_size if r.name == plan.role else r.total for r in spec.roles},
        role_json=role.model_dump_json(),
        health_json=spec.health.model_dump_json(),
        logs_json=spec.logs.model_dump_json(),
        run_id=run_id,
    )
