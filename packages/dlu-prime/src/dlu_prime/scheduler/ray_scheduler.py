"""The Ray side of scheduling: detached, named placement groups and actors for one job.

Everything is created under names from `dlu_prime.naming`, with `get_if_exists`, so a
restarted PrimeMaster adopts what is already there instead of creating duplicates. How one
actor is created (its options, what it is told) is `dlu_prime.scheduler.ray_actors`.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Mapping, Sequence
from typing import Any

import ray
from ray.exceptions import ActorUnavailableError, GetTimeoutError, RayActorError, RayError
from ray.util import placement_group_table
from ray.util.placement_group import PlacementGroup, get_placement_group, placement_group

from dlu_api.spec.models import JobSpec
from dlu_prime import naming, ray_private
from dlu_prime.naming import NAMESPACE, sub_master_name
from dlu_prime.roles import sub_master_path
from dlu_prime.scheduler.base import ActorObservation, ActorSetupError, Scheduler, SchedulingError
from dlu_prime.scheduler.cleanup import remove_group, remove_job_resources
from dlu_prime.scheduler.gpu import bundle_device_env
from dlu_prime.scheduler.memory_groups import MemoryGroups
from dlu_prime.scheduler.node_groups import NodeGroups
from dlu_prime.scheduler.placement import (
    ActorPlan,
    GroupPlan,
    PlacementPlan,
    node_group_name,
    plan_placement,
    scaled_actor,
    unplaced_message,
)
from dlu_prime.scheduler.ray_actors import (
    ActorClassFor,
    create_sub_master,
    create_worker,
    default_actor_class,
    error_text,
    setup_error,
)
from dlu_prime.scheduler.ray_queries import dead_nodes, node_of, reconstructed_fresh, requeue_shards

logger = logging.getLogger(__name__)

POLL_TIMEOUT_S = 10.0
# A status call not answered this soon is sent again. A call that was on its way to an actor
# process that died is failed by Ray only after waiting 1 to 2 s for news of the death, however
# soon Ray rebuilt the actor; the second call reaches the new process (measured: the role tier
# waited 0.3 to 1 s here for the PrimeMaster's poll of the killed rank).
RESEND_AFTER_S = 0.25
# How often a poll waiting on unanswered calls looks for news of a rebuilt actor (`renewed`).
_RENEWAL_CHECK_S = 0.05


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
        self._nodes: dict[str, str] = {}  # worker -> the Ray node its latest incarnation said
        self._extra_groups: dict[str, GroupPlan] = {}  # groups of actors a resize added
        self._renewed: set[str] = set()  # actors whose new incarnation said so during a poll
        self._sub_master_roles = {
            sub_master_name(spec.name, r.name): r for r in spec.roles if sub_master_path(r) is not None
        }
        self.node_groups = NodeGroups(spec, self.plan, self._placement_group)
        self.memory_groups = MemoryGroups(
            spec,
            self._extra_groups,
            lambda group, wait_s: self._wait_placement([group], wait_s),
            self._drop_group,
            group_of=self._group_plan,
            kept=self.node_groups.names,
            nodes=lambda: self._nodes,
        )

    # placement -------------------------------------------------------------------------------
    def _placement_group(self, group_name: str) -> PlacementGroup:
        if group_name in self._groups:
            return self._groups[group_name]
        group = self._group_plan(group_name)
        try:
            pg = get_placement_group(group.pg_name)
            if placement_group_table(pg).get("state") == "REMOVED":  # just given up: ask anew
                raise ValueError(group.pg_name)
            logger.info("adopted placement group %s", group.pg_name)
        except ValueError:
            pg = placement_group(
                [dict(b.resources) for b in group.bundles],
                strategy=group.strategy,
                name=group.pg_name,
                lifetime="detached",
                bundle_label_selector=[dict(s) for s in group.labels] or None,  # pyright: ignore[reportArgumentType]
            )
        self._groups[group_name] = pg
        return pg

    def _group_plan(self, name: str) -> GroupPlan:
        found = self._extra_groups.get(name)
        return found or next(g for g in self.plan.groups if g.name == name)

    def _wait_placement(self, groups: Sequence[GroupPlan] | None = None, wait_s: float | None = None) -> None:
        wanted = self.plan.groups if groups is None else groups
        pending = {g.name: self._placement_group(g.name) for g in wanted}
        ready_refs = {name: pg.ready() for name, pg in pending.items()}
        timeout = self._placement_timeout if wait_s is None else wait_s
        deadline = time.monotonic() + timeout
        for name, ref in ready_refs.items():
            try:
                ray.get(ref, timeout=max(0.1, deadline - time.monotonic()))
            except GetTimeoutError:
                group = self._group_plan(name)
                raise SchedulingError(unplaced_message(group, timeout, ray.available_resources())) from None

    # actors ----------------------------------------------------------------------------------
    def _create_actor(self, plan: ActorPlan) -> Any:
        actor_class = self._actor_class_for(self.spec.role(plan.role))
        plan = self.memory_groups.sized(plan, self._by_name)
        group = self._placement_group(plan.group)
        return create_worker(self.spec, plan, actor_class, group, self.workdir, self.run_id)

    def set_memory(self, memory: Mapping[str, int]) -> None:
        self.memory_groups.set(self._by_name, memory)

    def set_seats(self, seats: Mapping[str, str | None]) -> None:
        self.memory_groups.set_seats(seats)

    def _drop_group(self, group: GroupPlan) -> None:
        self._groups.pop(group.name, None)
        remove_group(group.pg_name)

    def handle(self, name: str) -> Any:
        if name not in self._handles:
            self._handles[name] = ray.get_actor(name, namespace=NAMESPACE)
        return self._handles[name]

    def prepare(self) -> dict[str, str | None]:
        per_node = self.node_groups.names()
        vacated = {g.name for g in self.plan.groups if self.memory_groups.vacated(self._by_name, g.name)}
        self._wait_placement([g for g in self.plan.groups if g.name not in per_node | vacated])
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
                name, handle = create_sub_master(self.spec, role, path, self.workdir)
                self._handles[name] = handle
                names.append(name)
        identities = self._call_all(names, "identity")
        self._gpu_ids = {name: list(identities[name]["gpu_ids"]) for name in names if name in self._by_name}
        return self._seen_nodes(identities)

    def _seen_nodes(self, identities: Mapping[str, Any]) -> dict[str, str | None]:
        """Each actor's node, as its incarnation said (kept: where a relaunched rank goes back)."""
        nodes = {name: identities[name]["node_id"] for name in identities}
        self._nodes.update({n: node for n, node in nodes.items() if n in self._by_name and node})
        return nodes

    def _call_all(self, names: Sequence[str], method: str, *args: Any) -> dict[str, Any]:
        """Call a method on many actors at once; the first failure raises ActorSetupError."""
        refs = {name: getattr(self.handle(name), method).remote(*args) for name in names}
        results: dict[str, Any] = {}
        for name, ref in refs.items():
            try:
                results[name] = ray.get(ref, timeout=self._call_timeout)
            except (RayError, GetTimeoutError) as exc:
                raise setup_error(name, exc) from None
        return results

    def _device_env(self, plan: ActorPlan | None) -> dict[str, str]:
        return (
            {} if plan is None else bundle_device_env(self.spec, plan, self._by_name.values(), self._gpu_ids)
        )

    def setup(self, names: Sequence[str]) -> None:
        refs = {
            name: self.handle(name).setup.remote(self._device_env(self._by_name.get(name))) for name in names
        }
        for name, ref in refs.items():
            try:
                ray.get(ref, timeout=self._call_timeout)
            except (RayError, GetTimeoutError) as exc:
                raise setup_error(name, exc) from None

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
            raise ActorSetupError(name, error_text(exc)) from None

    def poll(self, names: Sequence[str]) -> dict[str, ActorObservation]:
        """Every actor's status, asked of all at once; one not answered within `RESEND_AFTER_S`
        is asked again (see there) and the first answer of the two counts."""
        calls: dict[str, list[Any]] = {}
        out: dict[str, ActorObservation] = {}
        self._renewed.difference_update(names)  # calls sent from now on reach the new incarnation
        for name in names:
            try:
                calls[name] = [self.handle(name).status.remote()]
            except ValueError:
                out[name] = ActorObservation.gone(f"actor {name} no longer exists")
        deadline = time.monotonic() + POLL_TIMEOUT_S
        first = [refs[0] for refs in calls.values()]
        if first:
            _, slow = ray.wait(first, num_returns=len(first), timeout=RESEND_AFTER_S)
            unanswered = set(slow)
            for name, refs in calls.items():
                if refs[0] in unanswered:
                    with contextlib.suppress(ValueError):
                        refs.append(self.handle(name).status.remote())
        for name, refs in calls.items():
            out[name] = self._observe(name, refs, deadline)
        return out

    def renewed(self, name: str) -> None:
        """A rebuilt actor reported its new incarnation (any thread): a poll waiting on calls
        sent to the old one asks the new one at once (Ray fails the old calls only later)."""
        self._renewed.add(name)

    def _observe(self, name: str, refs: list[Any], deadline: float) -> ActorObservation:
        """The first answer among `refs` (status calls to one actor) by `deadline`; an actor
        being rebuilt answers the resent call, so a failed first call waits for the other."""
        pending = list(refs)
        while True:
            remaining = max(0.0, deadline - time.monotonic())
            ready, _ = ray.wait(pending, num_returns=1, timeout=min(remaining, _RENEWAL_CHECK_S))
            if not ready and name in self._renewed:
                self._renewed.discard(name)
                with contextlib.suppress(ValueError):
                    pending.append(self.handle(name).status.remote())
                continue
            if not ready and remaining > _RENEWAL_CHECK_S:
                continue
            if not ready:
                return ActorObservation.gone(f"actor {name} did not answer in {POLL_TIMEOUT_S:g} s")
            pending.remove(ready[0])
            try:
                return ActorObservation.from_status(ray.get(ready[0]))
            except ActorUnavailableError as exc:
                if not pending:
                    return ActorObservation.restarting(f"actor {name} is restarting: {error_text(exc)}")
            except RayActorError as exc:
                self._handles.pop(name, None)
                return ActorObservation.gone(f"actor {name} died: {error_text(exc)}")
            except RayError as exc:
                if not pending:
                    return ActorObservation.gone(f"actor {name} did not answer: {error_text(exc)}")

    def _reconstructed_fresh(self, name: str) -> bool:
        try:
            return reconstructed_fresh(self.handle(name))
        except ValueError:
            return False

    def restart(self, names: Sequence[str]) -> dict[str, str | None]:
        replace = [name for name in names if not self._reconstructed_fresh(name)]
        for name in replace:  # a rebuilt PrimeMaster's: where a relaunched rank ran is asked first
            if self.memory_groups.pinned(name) and name not in self._nodes:
                self._nodes.update(node_of(name, self.handle))
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
                self._handles[name] = create_sub_master(
                    self.spec, role, sub_master_path(role) or "", self.workdir
                )[1]
        identities = self._call_all(names, "identity")
        self._gpu_ids.update(
            {name: list(identities[name]["gpu_ids"]) for name in names if name in self._by_name}
        )
        self.setup(names)
        return self._seen_nodes(identities)

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
        own = [p for p in plans if p.group in self._extra_groups and not self.memory_groups.seated(p.name)]
        self._wait_placement([self._group_plan(p.group) for p in own])
        for plan in plans:
            self._handles[plan.name] = self._create_actor(plan)
        names = [p.name for p in plans]
        identities = self._call_all(names, "identity")
        self._gpu_ids.update({name: list(identities[name]["gpu_ids"]) for name in names})
        self.setup(names)
        return self._seen_nodes(identities)

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
            self.memory_groups.forget(name, self._by_name)

    def placed_nodes(self, role: str, nodes: Sequence[int], wait_s: float = 0.0) -> list[int]:
        return self.node_groups.placed(role, nodes, wait_s)

    def node_needs(self, role: str) -> str:
        return self.node_groups.needs(role)

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

    def last_nodes(self, names: Sequence[str]) -> dict[str, str]:
        return ray_private.dead_actor_nodes(names)

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
