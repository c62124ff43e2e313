"""The actors a memory relaunch gave more memory, each in a placement group of its own of that
size (`placement.memory_actor`): a placement group's bundles cannot grow, and the role's bundle
was sized for the old amount. Ray's calls are the caller's (`place`, `remove`).

The group an actor leaves is given back once none of the job's actors is left in it (Ray
gives a group's bundles back only with the whole group; removing it while other actors sit in
it would kill them), and asked for again, whole, when one of its actors comes back to its
role's memory. A node group of an elastic role is kept: it is how the job holds that node.

An elastic rank's own group is asked for on its old node first, then anywhere but the nodes of
its role's other node ranks (`node_pinning`)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Mapping
from dataclasses import replace

from dlu_api.spec.models import JobSpec, RoleKind
from dlu_prime.scheduler.base import SchedulingError
from dlu_prime.scheduler.free_bundles import Ledger, Seat, parse_seat
from dlu_prime.scheduler.node_pinning import PIN_WAIT_S, node_choices, other_nodes, selected
from dlu_prime.scheduler.placement import ActorPlan, GroupPlan, memory_actor, plan_placement

logger = logging.getLogger(__name__)


class MemoryGroups:
    def __init__(
        self,
        spec: JobSpec,
        extra_groups: dict[str, GroupPlan],
        place: Callable[[GroupPlan, float | None], None],
        remove: Callable[[GroupPlan], None],
        *,
        group_of: Callable[[str], GroupPlan] | None = None,
        kept: Callable[[], Collection[str]] = frozenset,
        nodes: Callable[[], Mapping[str, str]] = dict,
    ) -> None:
        self.spec = spec
        self._extra = extra_groups  # the scheduler's groups beyond the spec's: these join them
        self._place = place  # wait until placed (raises SchedulingError past the wait, None: the default)
        self._nodes = nodes  # actor -> the Ray node its latest incarnation ran on
        self._remove = remove
        self._group_of = group_of  # a group's plan by name (None: the groups are never given back)
        self._kept = kept  # groups never given back (the node groups of elastic roles)
        self._memory: dict[str, int] = {}  # actor -> the memory a relaunch gave it (bytes)
        self._groups: dict[str, GroupPlan] = {}  # actor -> its own group of that size
        self._seats: dict[str, Seat] = {}  # actor -> the bundle another actor left that it sits in
        self._spec_groups = {g.name: g for g in plan_placement(spec).groups}
        self.released: set[str] = set()  # the groups given back that no actor of the job was left in

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

    def set_seats(self, seats: Mapping[str, str | None]) -> None:
        """`Scheduler.set_seats`: from the next incarnation of each named worker on."""
        for name, seat in seats.items():
            if seat is None:
                self._seats.pop(name, None)
            else:
                self._seats[name] = parse_seat(seat)

    def seated(self, name: str) -> bool:
        return name in self._seats

    def pinned(self, name: str) -> bool:
        """The actor's next incarnation asks for a group on its old node (a relaunched elastic rank)."""
        plan = self._groups.get(name)
        return plan is not None and self.spec.role(plan.roles[0]).kind is RoleKind.ELASTIC

    def ledger(self, plans: Mapping[str, ActorPlan]) -> Ledger:
        """Where the job's actors sit (`free_bundles`), as this scheduler was told."""
        return Ledger(self._spec_groups, plans, self._memory, self._seats, self._kept())

    def vacated(self, plans: Mapping[str, ActorPlan], group: str) -> bool:
        """No actor of the job is left in `group` (and it may be given back)."""
        return group in self.ledger(plans).vacated()

    def sized(self, plan: ActorPlan, plans: Mapping[str, ActorPlan] | None = None) -> ActorPlan:
        """`plan` where the actor's next incarnation sits: in the bundle it was seated in (one
        another actor left; no group of its own), else, with the memory a relaunch gave it, in a
        group of that size (created and placed now; a group of another size the actor had is
        removed first). Then every group no actor of the job is left in is given back (`plans`:
        every actor's own plan); an actor back at its role's memory has its group asked for again."""
        amount = self._memory.get(plan.name)
        old = self._groups.get(plan.name)
        seat = self._seats.get(plan.name)
        if seat is not None:
            if old is not None:
                self._drop(plan.name)
            options = plan.options if amount is None else {**plan.options, "memory": amount}
            placed = replace(plan, group=seat[0], bundle_index=seat[1], options=options)
        elif amount is None:
            if old is not None:
                self._drop(plan.name)
            if old is not None or plan.group in self.released:
                self._reclaim(plan.group)
            return plan
        else:
            group, placed = memory_actor(self.spec, plan, amount)
            if old is not None and old.name != group.name:
                self._drop(plan.name)
            self._groups[plan.name] = self._placed(group, plan, plans)
        if plans is not None:
            self.give_back(plans)
        return placed

    def give_back(self, plans: Mapping[str, ActorPlan]) -> None:
        """Give back every group no actor of the job is left in (idempotent)."""
        if self._group_of is not None:
            for group in sorted(self.ledger(plans).vacated()):
                self._release(group)

    def _placed(self, group: GroupPlan, plan: ActorPlan, plans: Mapping[str, ActorPlan] | None) -> GroupPlan:
        """Ask for the actor's own group and wait for it: an elastic rank's on its old node if
        that has room, else anywhere its role's other node ranks are not (`node_pinning`)."""
        if plans is None or self.spec.role(plan.role).kind is not RoleKind.ELASTIC:
            self._extra[group.name] = group
            self._place(group, None)
            return group
        nodes = self._nodes()
        choices = node_choices(nodes.get(plan.name), other_nodes(plans, nodes, plan))
        for k, selector in enumerate(choices):
            asked = selected(group, selector)
            self._extra[group.name] = asked
            last = k == len(choices) - 1
            try:
                self._place(asked, None if last else PIN_WAIT_S)
                return asked
            except SchedulingError:
                if last:
                    raise
                logger.info(
                    "%s: no room on its old node within %gs; asked for elsewhere", plan.name, PIN_WAIT_S
                )
                self._remove(asked)
        raise AssertionError("node_choices always ends with a choice")  # pragma: no cover

    def forget(self, name: str, plans: Mapping[str, ActorPlan] | None = None) -> None:
        """The actor was removed (a shrink): its override, its seat and its group go with it; a
        group only it was left in is given back."""
        self._memory.pop(name, None)
        self._drop(name)
        if self._seats.pop(name, None) is not None and plans is not None:
            self.give_back(plans)

    def _drop(self, name: str) -> None:
        group = self._groups.pop(name, None)
        if group is not None:
            self._extra.pop(group.name, None)
            self._remove(group)

    def _release(self, name: str) -> None:
        """Give back a group no actor of the job is left in (idempotent: also on every later
        incarnation, so a PrimeMaster that died before giving it back has it given back)."""
        assert self._group_of is not None
        self._remove(self._group_of(name))
        if name not in self.released:
            self.released.add(name)
            logger.info("gave back placement group %s: every actor in it has one of its own", name)

    def _reclaim(self, name: str) -> None:
        """An actor back at its role's memory goes back to the group it left: ask for it again
        (adopted by name where it is still there) and wait for it."""
        if self._group_of is not None:
            self.released.discard(name)
            self._place(self._group_of(name), None)
