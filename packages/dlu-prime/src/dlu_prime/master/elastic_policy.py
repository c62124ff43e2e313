"""When an elastic role with a MIN:MAX range changes its node count: pure rules of state and time.

- Shrink: a node whose ranks' actors are gone and Ray marked the node dead, or that stayed
  unplaceable (Ray restarting them) past `elastic.replace_timeout_s`, is lost for good; with
  the survivors still >= MIN (and no Extension to replace the node) the role shrinks to them,
  in place, as one resize. Below MIN it waits for capacity up to the timeout (nodes Ray places
  meanwhile join in that one resize), then the job stops with a reason naming the nodes it
  has, the nodes it needs and what one node needs, the loss counted once on the lost node.
- Grow: a node the role misses (below its target, MAX unless `dlu scale` set one) whose
  placement group Ray placed joins, at most one automatic resize per `elastic.resize_interval_s`.
- By hand: `dlu scale JOB ROLE N` sets the target (a node count within MIN..MAX): surplus nodes
  stop (highest first), missing ones (lowest first) are added.

The decision core decides with these rules (`core/elastic_chain.py`, `core/resize_chain.py`);
the executor does the I/O.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

from dlu_api.spec.models import RoleKind, RoleSpec
from dlu_api.status import JobStage
from dlu_prime.master.causality import caused_by_loss
from dlu_prime.master.resize_plan import ResizePlan, ScaleError, StartedWithout
from dlu_prime.master.state import SUB_MASTER_RANK, JobState
from dlu_prime.naming import actor_name

NODE_LOST = "node lost"
GROWN = "capacity"  # the cause of an automatic growth
BY_HAND = "dlu scale"


def resizable_elastic(role: RoleSpec) -> bool:
    """An elastic role with a MIN:MAX range: its node count changes while it runs."""
    return (
        role.kind is RoleKind.ELASTIC
        and role.elastic is not None
        and role.elastic.min_nodes < role.elastic.max_nodes
    )


def elastic_roles(state: JobState) -> list[RoleSpec]:
    return [r for r in state.spec.roles if resizable_elastic(r)]


def role_nodes(state: JobState, role: str) -> dict[int, list[str]]:
    """Node index -> its ranks' actor names, of the role's workers in the state now."""
    per = state.spec.role(role).per_group
    out: dict[int, list[str]] = {}
    for name, record in sorted(state.actors.items(), key=lambda item: item[1].rank):
        if record.role == role and record.rank != SUB_MASTER_RANK:
            out.setdefault(record.rank // per, []).append(name)
    return out


def target_nodes(state: JobState, role: str) -> int:
    """The node count the role aims at: MAX unless `dlu scale` set one."""
    spec = state.spec.role(role)
    assert spec.elastic is not None
    record = state.roles.get(role)
    wanted = record.target_nodes if record is not None else None
    return spec.elastic.max_nodes if wanted is None else wanted


def _plan(state: JobState, role: str, keep: Collection[int], add: Collection[int]) -> ResizePlan:
    spec = state.spec.role(role)
    nodes = role_nodes(state, role)
    removed = tuple(name for k in sorted(nodes, reverse=True) if k not in keep for name in reversed(nodes[k]))
    added = tuple(
        (actor_name(state.job, role, rank), rank)
        for k in sorted(add)
        for rank in range(k * spec.per_group, (k + 1) * spec.per_group)
    )
    new = len([k for k in nodes if k in keep]) + len(add)
    return ResizePlan(role, len(nodes), new, added=added, removed=removed, nodes=new)


def busy_reason(state: JobState) -> str | None:
    """Why no resize can begin now (None: one can)."""
    if state.stage is not JobStage.RUNNING:
        return f"the job is {state.stage.value}"
    if state.resize is not None:
        return f"role {state.resize.role} is resizing"
    if state.failover is not None:
        return "a failover is in flight"
    return None


@dataclass(frozen=True)
class LossVerdict:
    """What to do about a role's nodes whose actors are gone this pass."""

    shrink: ResizePlan | None = None  # survivors (plus nodes Ray placed) >= MIN: this resize
    hold: frozenset[str] = frozenset()  # failures not judged yet (waiting for Ray or capacity)
    lost: tuple[int, ...] = ()  # the nodes lost for good
    below_min: str | None = None  # below MIN: what the role has, needs and waits for
    stop: str | None = None  # below MIN past the timeout: the job stops with this reason
    culprit: str | None = None  # with `stop`: the lost node's actor, the one fault counted


def judge_loss(
    state: JobState,
    role: str,
    gone: Mapping[str, float],
    dead_ray_nodes: Collection[str],
    now: float,
    has_extension: bool,
    placed: Collection[int] = (),
) -> LossVerdict:
    """`gone`: the role's actors that are gone or unplaceable now -> since when (this clock);
    `placed`: nodes the role does not have whose placement groups Ray placed (capacity).

    A node is lost for good when one of its actors is gone and Ray marked its Ray node dead, or
    when it stayed gone past replace_timeout_s. With an Extension a node is never lost here (it
    is relaunched, tier 4). Survivors >= MIN: one shrink in place. Below MIN the role waits for
    capacity up to replace_timeout_s from the loss: nodes Ray places meanwhile join in the same
    resize (survivors plus them >= MIN), and a lost node whose group Ray places again comes back
    through the failover ladder (Ray rebuilds its actors). Past the timeout the job stops, the
    loss counted once on the lost node (a restart of the survivors could not bring capacity
    back). A failover or resize in flight: held until the timeout, then the failover ladder."""
    spec = state.spec.role(role)
    assert spec.elastic is not None
    if has_extension or not gone:
        return LossVerdict()
    timeout = spec.elastic.replace_timeout_s
    nodes = role_nodes(state, role)
    lost: list[int] = []
    hold: set[str] = set()
    dead_lost = False
    for k, names in nodes.items():
        down = [n for n in names if n in gone]
        if not down:
            continue
        ray_node = {state.actors[n].node_id for n in down}
        overdue = any(now - gone[n] > timeout for n in down)
        if overdue or ray_node & set(dead_ray_nodes):
            lost.append(k)
            dead_lost |= bool(ray_node & set(dead_ray_nodes))
        hold.update(down)
    if not lost:
        return LossVerdict(hold=frozenset(hold))
    survivors = [k for k in nodes if k not in lost]
    low = spec.elastic.min_nodes
    busy = busy_reason(state) is not None
    if len(survivors) >= low and not busy:
        return LossVerdict(shrink=_plan(state, role, survivors, ()), hold=frozenset(hold), lost=tuple(lost))
    if busy:  # wait up to the timeout, then the failover ladder
        overdue_names = {n for n in hold if now - gone[n] > timeout}
        return LossVerdict(hold=frozenset(hold - overdue_names), lost=tuple(lost))
    room = target_nodes(state, role) - len(survivors)
    joining = sorted(k for k in placed if k not in nodes)[: max(0, room)]
    if len(survivors) + len(joining) >= low:
        plan = _plan(state, role, survivors, joining)
        return LossVerdict(shrink=plan, hold=frozenset(hold), lost=tuple(lost))
    which = ", ".join(f"node {k}" for k in lost)
    why = "Ray marked it dead" if dead_lost else f"unplaceable for {timeout:g}s"
    has = (
        f"role {role} has {len(survivors)} node(s) after losing {which} ({why}) and needs at least "
        f"{low} (nnodes {spec.elastic.nnodes})"
    )
    went = [n for k in lost for n in nodes[k] if n in gone]
    if now - min(gone[n] for n in went) <= timeout:
        waiting = f"{has}: waiting up to {timeout:g}s (elastic.replace_timeout_s) for capacity"
        return LossVerdict(hold=frozenset(hold), lost=tuple(lost), below_min=waiting)
    culprit = min(went, key=lambda n: (gone[n], state.actors[n].rank))
    stop = f"{has}; no node could be placed in {timeout:g}s (elastic.replace_timeout_s)"
    return LossVerdict(hold=frozenset(hold), lost=tuple(lost), below_min=has, stop=stop, culprit=culprit)


# A rank's collective fails the moment a peer's node dies, before the PrimeMaster can see the
# node gone (its next poll, up to the poll timeout later): such an in-place restart was judged
# a fault of its own. Only restarts this close before the loss was seen can be its effect; of
# those, only the ones it caused are (`causality.caused_by_loss`).
POLL_LAG_S = 10.0


def forgiven_by_loss(state: JobState, role: str, seen_gone_at: float, lost_actors: Collection[str]) -> int:
    """How many of the role's counted in-place restarts the loss of `lost_actors` caused: they
    are the resize's, not faults. An independent crash just before it stays counted."""
    since = seen_gone_at - state.spec.health.monitor_interval_s - POLL_LAG_S
    # A restart before the role's world was last re-formed (a resize done) was in a world the
    # loss never touched: its node may since host a lost rank (seeds 45861, 78917: a counted own
    # crash, then a `dlu scale`, then the node of that crash lost, forgave it).
    reformed = [
        e.time for e in state.events if e.kind == "resize_done" and e.role == role and e.time <= seen_gone_at
    ]
    since = max([since, *reformed])
    lost_nodes = {state.actors[n].node_id for n in lost_actors if n in state.actors} - {None}
    restarts = [
        (e.actor, e.node_id, e.message)
        for e in state.events
        if e.kind == "inplace_restart" and e.role == role and e.time >= since
    ]
    return caused_by_loss(restarts, lost_actors, {n for n in lost_nodes if n is not None})


def grow_nodes(
    state: JobState, role: str, placed: Sequence[int], now: float, last_resize_at: float | None
) -> ResizePlan | None:
    """An automatic growth onto nodes Ray placed, or None (nothing placed, at the target, busy,
    or within resize_interval_s of the role's last resize)."""
    spec = state.spec.role(role)
    assert spec.elastic is not None
    nodes = role_nodes(state, role)
    room = target_nodes(state, role) - len(nodes)
    add = sorted(k for k in placed if k not in nodes)[: max(0, room)]
    if not add or busy_reason(state) is not None:
        return None
    if last_resize_at is not None and now - last_resize_at < spec.elastic.resize_interval_s:
        return None
    return _plan(state, role, list(nodes), add)


def missing_nodes(state: JobState, role: str) -> list[int]:
    """Node indexes the role lacks to reach its target, lowest first (what it asks Ray for)."""
    spec = state.spec.role(role)
    have = role_nodes(state, role)
    count = spec.total // spec.per_group
    return [k for k in range(count) if k not in have][: max(0, target_nodes(state, role) - len(have))]


def plan_elastic_scale(state: JobState, role: str, size: int) -> ResizePlan:
    """`dlu scale JOB ROLE N` of an elastic role: N nodes within MIN..MAX (checked by the
    caller: running, known, resizable). Surplus nodes stop highest first; missing ones are the
    lowest free node indexes.

    Raises:
        ScaleError: N outside MIN..MAX, or no range to resize within.
    """
    spec = state.spec.role(role)
    assert spec.elastic is not None
    low, high = spec.elastic.min_nodes, spec.elastic.max_nodes
    if low == high:
        raise ScaleError(
            f"role {role!r} of job {state.job} has a fixed size (nnodes {spec.elastic.nnodes}): give "
            f"elastic.nnodes a range MIN:MAX and submit the job again to scale it"
        )
    if isinstance(size, bool) or not isinstance(size, int) or not low <= size <= high:
        raise ScaleError(
            f"size {size!r} for elastic role {role!r} is a node count outside its nnodes {low}:{high}: "
            f"give a whole number from {low} to {high}, or widen elastic.nnodes and submit the job again"
        )
    nodes = sorted(role_nodes(state, role))
    if size <= len(nodes):
        return _plan(state, role, nodes[:size], ())
    count = spec.total // spec.per_group
    free = [k for k in range(count) if k not in nodes][: size - len(nodes)]
    return _plan(state, role, nodes, free)


def unplaced_elastic(state: JobState, nodes: Mapping[str, str | None]) -> list[StartedWithout]:
    """After placement: the actors of elastic roles' nodes Ray could not place in time (not in
    `nodes`) leave the state; the role starts with the others and grows later."""
    missing: list[str] = []
    parts: list[str] = []
    for spec in elastic_roles(state):
        names = [n for n, a in state.actors.items() if a.role == spec.name and a.rank != SUB_MASTER_RANK]
        absent = [n for n in names if n not in nodes]
        if absent:
            per = spec.per_group
            have = len({state.actors[n].rank // per for n in names if n in nodes})
            assert spec.elastic is not None
            parts.append(
                f"role {spec.name} starts with {have} of {spec.elastic.max_nodes} node(s) "
                f"(nnodes {spec.elastic.nnodes}); it keeps asking Ray for the others"
            )
            missing.extend(absent)
    return [StartedWithout(tuple(missing), "; ".join(parts))] if missing else []
