"""The actors a memory relaunch gave more memory, each in a placement group of its own of that
size (`placement.memory_actor`): a placement group's bundles cannot grow, and the role's bundle
was sized for the old amount. Ray's calls are the caller's (`place`, `remove`)."""

from __future__ import annotations

from collections.abc import Callable, Mapping

from dlu_api.spec.models import JobSpec
from dlu_prime.scheduler.placement import ActorPlan, GroupPlan, memory_actor


class MemoryGroups:
    def __init__(
        self,
        spec: JobSpec,
        extra_groups: dict[str, GroupPlan],
        place: Callable[[GroupPlan], None],
        remove: Callable[[GroupPlan], None],
    ) -> None:
        self.spec = spec
        self._extra = extra_groups  # the scheduler's groups beyond the spec's: these join them
        self._place = place
        self._remove = remove
        self._memory: dict[str, int] = {}  # actor -> the memory a relaunch gave it (bytes)
        self._groups: dict[str, GroupPlan] = {}  # actor -> its own group of that size

    def set(self, plans: Mapping[str, ActorPlan], memory: Mapping[str, int]) -> None:
        """`Scheduler.set_memory`: from the next incarnation of each named worker on."""
        for name, amount in memory.items():
            plan = plans.get(name)
            if plan is None:
                continue  # a SubMaster: it asks for no memory of its own
            if amount == self.spec.role(plan.role).resources.memory:
                self._memory.pop(name, None)
                continue
            self._memory[name] = amount
            if name not in self._groups:  # its group now (a rebuilt PrimeMaster adopts it by name)
                self._groups[name] = memory_actor(self.spec, plan, amount)[0]

    def sized(self, plan: ActorPlan) -> ActorPlan:
        """`plan` with the memory a relaunch gave the actor, in a group of that size (created and
        placed now; a group of another size the actor had is removed first)."""
        amount = self._memory.get(plan.name)
        old = self._groups.get(plan.name)
        if amount is None:
            if old is not None:
                self._drop(plan.name)
            return plan
        group, sized = memory_actor(self.spec, plan, amount)
        if old is not None and old.name != group.name:
            self._drop(plan.name)
        self._groups[plan.name] = group
        self._extra[group.name] = group
        self._place(group)
        return sized

    def forget(self, name: str) -> None:
        """The actor was removed (a shrink): its override and its group go with it."""
        self._memory.pop(name, None)
        self._drop(name)

    def _drop(self, name: str) -> None:
        group = self._groups.pop(name, None)
        if group is not None:
            self._extra.pop(group.name, None)
            self._remove(group)
