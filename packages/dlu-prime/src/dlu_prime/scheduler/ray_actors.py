"""How the scheduler creates one actor on Ray: a worker in its placement group bundle, or a
role's SubMaster next to the PrimeMaster; detached, named, reconstructed by Ray when it dies.

Also how a failed call on an actor reads as an error (`setup_error`, `error_text`).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

import ray
from ray.exceptions import ActorUnavailableError, RayActorError, RayTaskError
from ray.util.placement_group import PlacementGroup
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from dlu_api.spec.models import JobSpec, RoleSpec
from dlu_prime.master.state import SUB_MASTER_RANK
from dlu_prime.naming import NAMESPACE, sub_master_name
from dlu_prime.roles import worker_actor_path
from dlu_prime.scheduler.base import ActorSetupError
from dlu_prime.scheduler.gpu import NOSET_ENV_VAR, ray_noset_visible_devices
from dlu_prime.scheduler.placement import ISOLATION_AMOUNT, ActorPlan
from dlu_prime.scheduler.worker_info import worker_info
from dlu_prime.worker.actor import WorkerActor, WorkerInfo
from dlu_prime.worker.submaster import SubMasterActor

ActorClassFor = Callable[[RoleSpec], type]

RPC_CONCURRENCY = 64
# Ray reconstructs a dead worker or SubMaster and the new incarnation reports RESTARTED: the
# failover ladder starts there (the seed). The PrimeMaster's limits bound the restarts; Ray's
# own count must never end a recovery first.
RECONSTRUCT = -1


def default_actor_class(role: RoleSpec) -> type:
    """The actor class of a role's workers: dlu-elastic's for elastic roles, else WorkerActor."""
    path = worker_actor_path(role)
    if path is None:
        return WorkerActor
    module, _, attr = path.partition(":")
    return getattr(importlib.import_module(module), attr)


def setup_error(name: str, exc: BaseException) -> ActorSetupError:
    """A failed lifecycle call; transient when the actor's process died under it (Ray rebuilds
    it, and the call can be made again on the new incarnation)."""
    died = isinstance(exc, RayActorError | ActorUnavailableError) and not isinstance(exc, RayTaskError)
    return ActorSetupError(name, error_text(exc), transient=died)


def error_text(exc: BaseException) -> str:
    if isinstance(exc, RayTaskError):
        return str(exc.cause) if exc.cause is not None else str(exc)
    return f"{type(exc).__name__}: {exc}"


def create_worker(
    spec: JobSpec, plan: ActorPlan, actor_class: type, group: PlacementGroup, workdir: str | None, run_id: str
) -> Any:
    """A worker actor in its placement group bundle, detached and named (adopted if it exists)."""
    role = spec.role(plan.role)
    env_vars = {NOSET_ENV_VAR: "1"} if ray_noset_visible_devices(role) else {}
    remote_class = ray.remote(actor_class)
    options: dict[str, Any] = {
        **plan.options,
        "name": plan.name,
        "namespace": NAMESPACE,
        "lifetime": "detached",
        "get_if_exists": True,
        "max_restarts": RECONSTRUCT,
        "max_concurrency": RPC_CONCURRENCY,
        "scheduling_strategy": PlacementGroupSchedulingStrategy(
            placement_group=group,
            placement_group_bundle_index=plan.bundle_index,
        ),
    }
    if env_vars:
        options["runtime_env"] = {"env_vars": env_vars}
    return remote_class.options(**options).remote(worker_info(spec, plan, workdir, run_id))  # pyright: ignore[reportUnknownMemberType]


def create_sub_master(spec: JobSpec, role: RoleSpec, path: str, workdir: str | None) -> tuple[str, Any]:
    """A role's SubMaster: outside the placement groups, next to the PrimeMaster."""
    name = sub_master_name(spec.name, role.name)
    info = WorkerInfo(
        job=spec.name,
        role=role.name,
        rank=SUB_MASTER_RANK,
        world_size=role.total,
        local_rank=0,
        local_world_size=1,
        node_rank=0,
        actor_name=name,
        entrypoint=path,
        env={**spec.env, **role.env},
        config=dict(spec.config),
        workdir=workdir,
        role_sizes={r.name: r.total for r in spec.roles},
        role_json=role.model_dump_json(),
        health_json=spec.health.model_dump_json(),
    )
    isolation = spec.master.isolation_resource
    handle = (
        ray.remote(SubMasterActor)
        .options(  # pyright: ignore[reportUnknownMemberType]
            name=name,
            namespace=NAMESPACE,
            lifetime="detached",
            get_if_exists=True,
            max_restarts=RECONSTRUCT,
            max_concurrency=RPC_CONCURRENCY,
            num_cpus=0,
            resources={isolation: ISOLATION_AMOUNT} if isolation else {},
        )
        .remote(info)
    )
    return name, handle
