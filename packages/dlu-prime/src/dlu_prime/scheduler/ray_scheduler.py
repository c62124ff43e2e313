"""The Ray side of scheduling: detached, named placement groups and actors for one job.

Everything is created under names from `dlu_prime.naming`, with `get_if_exists`, so a
restarted PrimeMaster adopts what is already there instead of creating duplicates.
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

import ray
from ray.exceptions import ActorUnavailableError, GetTimeoutError, RayActorError, RayError, RayTaskError
from ray.util.placement_group import PlacementGroup, get_placement_group, placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from dlu_api.spec.models import JobSpec, RoleSpec
from dlu_prime import naming
from dlu_prime.master.state import SUB_MASTER_RANK
from dlu_prime.naming import NAMESPACE, sub_master_name
from dlu_prime.roles import sub_master_path, worker_actor_path
from dlu_prime.scheduler.base import ActorObservation, ActorSetupError, Scheduler, SchedulingError
from dlu_prime.scheduler.cleanup import remove_group, remove_job_resources
from dlu_prime.scheduler.gpu import NOSET_ENV_VAR, device_env, ray_noset_visible_devices
from dlu_prime.scheduler.node_groups import NodeGroups
from dlu_prime.scheduler.placement import (
    ISOLATION_AMOUNT,
    ActorPlan,
    GroupPlan,
    PlacementPlan,
    node_group_name,
    plan_placement,
    scaled_actor,
    unplaced_message,
)
from dlu_prime.scheduler.ray_queries import dead_nodes, requeue_shards
from dlu_prime.scheduler.worker_info import worker_info
from dlu_prime.worker.actor import WorkerActor, WorkerInfo
from dlu_prime.worker.submaster import SubMasterActor

logger = logging.getLogger(__name__)

ActorClassFor = Callable[[RoleSpec], type]

RPC_CONCURRENCY = 64
# Ray reconstructs a dead worker or SubMaster and the new incarnation reports RESTARTED: the
# failover ladder starts there (the seed). The PrimeMaster's limits bound the restarts; Ray's
# own count must never end a recovery first.
RECONSTRUCT = -1
POLL_TIMEOUT_S = 10.0


def default_actor_class(role: RoleSpec) -> type:
    """The actor class of a role's workers: dlu-elastic's for elastic roles, else WorkerActor."""
    path = worker_actor_path(role)
    if path is None:
        return WorkerActor
    module, _, attr = path.partition(":")
    return getattr(importlib.import_module(module), attr)


def _setup_error(name: str, exc: BaseException) -> ActorSetupError:
    """A failed lifecycle call; transient when the actor's process died under it (Ray rebuilds
    it, and the call can be made again on the new incarnation)."""
    died = isinstance(exc, RayActorError | ActorUnavailableError) and not isinstance(exc, RayTaskError)
    return ActorSetupError(name, _error_text(exc), transient=died)


def _error_text(exc: BaseException) -> str:
    if isinstance(exc, RayTaskError):
        return str(exc.cause) if exc.cause is not None else str(exc)
    return f"{type(exc).__name__}: {exc}"


class RayScheduler(Scheduler):
    def __init__(
        self,
        spec: JobSpec,
        *,
        workdir: str | None = None,
        actor_class_for: ActorClassFor = default_actor_class,
        placement_timeout_s: float = 60.0,
        call_timeout_s: float = 120.0,
    ) -> None:
        self.spec = spec
        self.plan: PlacementPlan = plan_placement(spec)
        self.workdir = workdir
        self._actor_class_for = actor_class_for
        self._placement_timeout = placement_timeout_s
        self._call_timeout = call_timeout_s
        self.run_id = ""
        """The job's run (JobState.run_id), set by the PrimeMaster once its state is known; workers
        see it as DLU_RUN_ID, to tell a new run of the same job from a restart of this one."""
        self._groups: dict[str, PlacementGroup] = {}
        self._handles: dict[str, Any] = {}
        self._by_name: dict[str, ActorPlan] = {a.name: a for a in self.plan.actors}
        self._gpu_ids: dict[str, list[str]] = {}
        self._extra_groups: dict[str, GroupPlan] = {}  # groups of actors a resize added
        self._sub_master_roles = {
            sub_master_name(spec.name, r.name): r for r in spec.roles if sub_master_path(r) is not None
        }
        self.node_groups = NodeGroups(spec, self.plan, self._placement_group)

    # placement -------------------------------------------------------------------------------
    def _placement_group(self, group_name: str) -> PlacementGroup:
        if group_name in self._groups:
            return self._groups[group_name]
        group = self._group_plan(group_name)
        try:
            pg = get_placement_group(group.pg_name)
            logger.info("adopted placement group %s", group.pg_name)
        except ValueError:
            pg = placement_group(
                [dict(b.resources) for b in group.bundles],
                strategy=group.strategy,
                name=group.pg_name,
                lifetime="detached",
            )
        self._groups[group_name] = pg
        return pg

    def _group_plan(self, name: str) -> GroupPlan:
        found = self._extra_groups.get(name)
        return found or next(g for g in self.plan.groups if g.name == name)

    def _wait_placement(self, groups: Sequence[GroupPlan] | None = None) -> None:
        wanted = self.plan.groups if groups is None else groups
        pending = {g.name: self._placement_group(g.name) for g in wanted}
        ready_refs = {name: pg.ready() for name, pg in pending.items()}
        deadline = time.monotonic() + self._placement_timeout
        for name, ref in ready_refs.items():
            try:
                ray.get(ref, timeout=max(0.1, deadline - time.monotonic()))
            except GetTimeoutError:
                group = self._group_plan(name)
                raise SchedulingError(
                    unplaced_message(group, self._placement_timeout, ray.available_resources())
                ) from None

    # actors ----------------------------------------------------------------------------------
    def _create_actor(self, plan: ActorPlan) -> Any:
        role = self.spec.role(plan.role)
        env_vars = {NOSET_ENV_VAR: "1"} if ray_noset_visible_devices(role) else {}
        actor_class = ray.remote(self._actor_class_for(role))
        options: dict[str, Any] = {
            **plan.options,
            "name": plan.name,
            "namespace": NAMESPACE,
            "lifetime": "detached",
            "get_if_exists": True,
            "max_restarts": RECONSTRUCT,
            "max_concurrency": RPC_CONCURRENCY,
            "scheduling_strategy": PlacementGroupSchedulingStrategy(
                placement_group=self._placement_group(plan.group),
                placement_group_bundle_index=plan.bundle_index,
            ),
        }
        if env_vars:
            options["runtime_env"] = {"env_vars": env_vars}
        return actor_class.options(**options).remote(worker_info(self.spec, plan, self.workdir, self.run_id))  # pyright: ignore[reportUnknownMemberType]

    def _create_sub_master(self, role: RoleSpec, path: str) -> tuple[str, Any]:
        """A role's SubMaster: outside the placement groups, next to the PrimeMaster."""
        name = sub_master_name(self.spec.name, role.name)
        info = WorkerInfo(
            job=self.spec.name,
            role=role.name,
            rank=SUB_MASTER_RANK,
            world_size=role.total,
            local_rank=0,
            local_world_size=1,
            node_rank=0,
            actor_name=name,
            entrypoint=path,
            env={**self.spec.env, **role.env},
            config=dict(self.spec.config),
            workdir=self.workdir,
            role_sizes={r.name: r.total for r in self.spec.roles},
            role_json=role.model_dump_json(),
            health_json=self.spec.health.model_dump_json(),
        )
        isolation = self.spec.master.isolation_resource
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

    def handle(self, name: str) -> Any:
        if name not in self._handles:
            self._handles[name] = ray.get_actor(name, namespace=NAMESPACE)
        return self._handles[name]

    def prepare(self) -> dict[str, str | None]:
        per_node = self.node_groups.names()
        self._wait_placement([g for g in self.plan.groups if g.name not in per_node])
        starts, problem = self.node_groups.wait_start()
        if problem is not None:
            raise SchedulingError(problem)
        skipped = self.node_groups.not_started(starts)  # nodes not placed in time: still asked for
        plans = [a for a in self.plan.actors if a.name not in skipped]
        for plan in plans:
            self._handles[plan.name] = self._create_actor(plan)
        names = [a.name for a in plans]
        for role in self.spec.roles:
            path = sub_master_path(role)
            if path is not None:
                name, handle = self._create_sub_master(role, path)
                self._handles[name] = handle
                names.append(name)
        identities = self._call_all(names, "identity")
        self._gpu_ids = {name: list(identities[name]["gpu_ids"]) for name in names if name in self._by_name}
        return {name: identities[name]["node_id"] for name in names}

    def _call_all(self, names: Sequence[str], method: str, *args: Any) -> dict[str, Any]:
        """Call a method on many actors at once; the first failure raises ActorSetupError."""
        refs = {name: getattr(self.handle(name), method).remote(*args) for name in names}
        results: dict[str, Any] = {}
        for name, ref in refs.items():
            try:
                results[name] = ray.get(ref, timeout=self._call_timeout)
            except (RayError, GetTimeoutError) as exc:
                raise _setup_error(name, exc) from None
        return results

    def _device_env(self, plan: ActorPlan | None) -> dict[str, str]:
        if plan is None:  # a SubMaster: no devices
            return {}
        role = self.spec.role(plan.role)
        bundle_mates = [
            a
            for a in self._by_name.values()
            if a.role == plan.role and a.group == plan.group and a.node_rank == plan.node_rank
        ]
        group_ids = [self._gpu_ids.get(a.name, []) for a in sorted(bundle_mates, key=lambda a: a.local_rank)]
        env = device_env(
            role,
            plan.local_rank,
            self.spec.device_type.value,
            self.spec.device_per_node,
            group_ids if all(name in self._gpu_ids for name in (a.name for a in bundle_mates)) else None,
        )
        return env.env()

    def setup(self, names: Sequence[str]) -> None:
        refs = {
            name: self.handle(name).setup.remote(self._device_env(self._by_name.get(name))) for name in names
        }
        for name, ref in refs.items():
            try:
                ray.get(ref, timeout=self._call_timeout)
            except (RayError, GetTimeoutError) as exc:
                raise _setup_error(name, exc) from None

    def check_children(self, names: Sequence[str]) -> None:
        self._call_all(names, "check_child")

    def start(self, names: Sequence[str]) -> None:
        self._call_all(names, "start")

    def call(self, name: str, method: str, *args: Any, timeout_s: float | None = None) -> Any:
        try:
            return ray.get(
                getattr(self.handle(name), method).remote(*args), timeout=timeout_s or self._call_timeout
            )
        except (RayError, GetTimeoutError, ValueError) as exc:
            raise ActorSetupError(name, _error_text(exc)) from None

    def poll(self, names: Sequence[str]) -> dict[str, ActorObservation]:
        refs: dict[str, Any] = {}
        out: dict[str, ActorObservation] = {}
        for name in names:
            try:
                refs[name] = self.handle(name).status.remote()
            except ValueError:
                out[name] = ActorObservation.gone(f"actor {name} no longer exists")
        for name, ref in refs.items():
            try:
                out[name] = ActorObservation.from_status(ray.get(ref, timeout=POLL_TIMEOUT_S))
            except ActorUnavailableError as exc:
                out[name] = ActorObservation.restarting(f"actor {name} is restarting: {_error_text(exc)}")
            except RayActorError as exc:
                self._handles.pop(name, None)
                out[name] = ActorObservation.gone(f"actor {name} died: {_error_text(exc)}")
            except (RayError, GetTimeoutError) as exc:
                out[name] = ActorObservation.gone(f"actor {name} did not answer: {_error_text(exc)}")
        return out

    def _reconstructed_fresh(self, name: str) -> bool:
        """Ray already rebuilt this actor and nothing ran in it yet: set it up, do not replace it."""
        try:
            status: dict[str, Any] = ray.get(self.handle(name).status.remote(), timeout=5.0)
        except (RayError, GetTimeoutError, ValueError):
            return False
        return bool(status.get("reconstructed")) and status.get("stage") == "INIT"

    def restart(self, names: Sequence[str]) -> dict[str, str | None]:
        replace = [name for name in names if not self._reconstructed_fresh(name)]
        for name in replace:
            with contextlib.suppress(ValueError):  # already gone
                ray.kill(self.handle(name), no_restart=True)
            self._handles.pop(name, None)
        deadline = time.monotonic() + self._call_timeout
        for name in replace:  # a name is free again only once Ray has deregistered the dead actor
            while time.monotonic() < deadline:
                try:
                    ray.get_actor(name, namespace=NAMESPACE)
                except ValueError:
                    break
                time.sleep(0.05)
        for name in replace:
            plan = self._by_name.get(name)
            if plan is not None:
                self._handles[name] = self._create_actor(plan)
            else:
                role = self._sub_master_roles[name]
                self._handles[name] = self._create_sub_master(role, sub_master_path(role) or "")[1]
        identities = self._call_all(names, "identity")
        self._gpu_ids.update(
            {name: list(identities[name]["gpu_ids"]) for name in names if name in self._by_name}
        )
        self.setup(names)
        return {name: identities[name]["node_id"] for name in names}

    # resizing a simple role ------------------------------------------------------------------
    def know(self, role: str, ranks: Sequence[int], world_size: int) -> None:
        for rank in ranks:
            group, plan = scaled_actor(self.spec, role, rank, world_size)
            if group is not None:
                self._extra_groups[group.name] = group
            self._by_name[plan.name] = plan

    def add_actors(self, role: str, ranks: Sequence[int], world_size: int) -> dict[str, str | None]:
        self.know(role, ranks, world_size)
        plans = [self._by_name[naming.actor_name(self.spec.name, role, r)] for r in ranks]
        self._wait_placement([self._group_plan(p.group) for p in plans if p.group in self._extra_groups])
        for plan in plans:
            self._handles[plan.name] = self._create_actor(plan)
        names = [p.name for p in plans]
        identities = self._call_all(names, "identity")
        self._gpu_ids.update({name: list(identities[name]["gpu_ids"]) for name in names})
        self.setup(names)
        return {name: identities[name]["node_id"] for name in names}

    def remove_actors(self, names: Sequence[str]) -> None:
        self.stop(names)
        for name in names:
            with contextlib.suppress(ValueError):  # already gone
                ray.kill(self.handle(name), no_restart=True)
            self._handles.pop(name, None)
            self._gpu_ids.pop(name, None)
            plan = self._by_name.get(name)
            group = self._extra_groups.pop(plan.group, None) if plan is not None else None
            if group is not None:
                self._groups.pop(group.name, None)
                remove_group(group.pg_name)

    def placed_nodes(self, role: str, nodes: Sequence[int], wait_s: float = 0.0) -> list[int]:
        return self.node_groups.placed(role, nodes, wait_s)

    def drop_actors(self, names: Sequence[str]) -> None:
        for name in names:
            with contextlib.suppress(ValueError):  # already gone
                ray.kill(self.handle(name), no_restart=True)
            self._handles.pop(name, None)
            self._gpu_ids.pop(name, None)

    def remove_node_groups(self, role: str, nodes: Sequence[int]) -> None:
        for k in nodes:
            self._groups.pop(node_group_name(role, k), None)
        self.node_groups.remove(role, nodes)

    def requeue_shards(self, queues: Sequence[str], workers: Sequence[str]) -> dict[str, list[int]]:
        return requeue_shards(self.spec.name, queues, workers)

    def dead_nodes(self, node_ids: Sequence[str]) -> set[str]:
        return dead_nodes(node_ids)

    def stop(self, names: Sequence[str]) -> None:
        refs: list[Any] = []
        for name in names:
            try:
                refs.append(self.handle(name).stop.remote())
            except ValueError:
                continue
        if refs:
            ray.wait(refs, num_returns=len(refs), timeout=5.0)

    def cleanup(self) -> None:
        self._handles.clear()
        self._groups.clear()
        remove_job_resources(self.spec.name, include_master=False)
