"""Who an agent is (`AgentInfo`) and where a complete round places it (`assign`).

Ranks are node-major and deterministic: agents sorted by (has no hint, node_rank_hint,
node_id, agent_id) get group ranks 0..n-1; an agent's rank offset is the sum of `local_ranks`
of the agents before it; the world size is the sum of all `local_ranks`; the torch master is
group rank 0 (its `host` and the `free_port` it reserved). One sort per round.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from dlu_elastic.rendezvous.state_errors import InvalidRequestError, check_id

MAX_LOCAL_RANKS = 1024  # processes per agent; keeps world sizes far inside int32


@dataclass(frozen=True, slots=True)
class AgentInfo:
    """What an agent says about itself when it joins. Validated on construction."""

    agent_id: str
    node_id: str
    local_ranks: int
    host: str
    free_port: int
    node_rank_hint: int | None = None

    def __post_init__(self) -> None:
        check_id("agent_id", self.agent_id)
        check_id("node_id", self.node_id)
        check_id("host", self.host)
        if not 1 <= self.local_ranks <= MAX_LOCAL_RANKS:
            raise InvalidRequestError(f"local_ranks must be in 1..{MAX_LOCAL_RANKS}, got {self.local_ranks}")
        if not 1 <= self.free_port <= 65535:
            raise InvalidRequestError(f"free_port must be in 1..65535, got {self.free_port}")
        if self.node_rank_hint is not None and self.node_rank_hint < 0:
            raise InvalidRequestError(f"node_rank_hint must be >= 0 when given, got {self.node_rank_hint}")

    def rank_key(self) -> tuple[bool, int, str, str]:
        """Sort key of the rank order: hinted agents first, in hint order, then by node and agent."""
        hint = self.node_rank_hint
        return (hint is None, 0 if hint is None else hint, self.node_id, self.agent_id)


@dataclass(frozen=True, slots=True)
class Placement:
    """One agent's place in a complete round."""

    agent: AgentInfo
    group_rank: int
    rank_offset: int


@dataclass(frozen=True)
class Assignment:
    """The frozen result of a complete round; `by_agent` makes per-agent lookups O(1)."""

    round: int
    placements: tuple[Placement, ...]  # indexed by group rank
    world_size: int
    master_addr: str
    master_port: int
    by_agent: Mapping[str, Placement] = field(repr=False, compare=False)

    @property
    def group_world_size(self) -> int:
        return len(self.placements)


def assign(round_: int, agents: Iterable[AgentInfo]) -> Assignment:
    """Node-major, deterministic ranks for a set of agents (see this module's docstring)."""
    ordered = sorted(agents, key=AgentInfo.rank_key)
    if not ordered:
        raise ValueError("cannot assign ranks to an empty round")
    placements: list[Placement] = []
    offset = 0
    for group_rank, agent in enumerate(ordered):
        placements.append(Placement(agent, group_rank, offset))
        offset += agent.local_ranks
    master = ordered[0]
    return Assignment(
        round=round_,
        placements=tuple(placements),
        world_size=offset,
        master_addr=master.host,
        master_port=master.free_port,
        by_agent={p.agent.agent_id: p for p in placements},
    )
