"""Pure rendezvous logic: completion rules on a fake clock, rank order, rounds, refusals."""

from __future__ import annotations

import random
import threading

import pytest

from dlu_elastic.rendezvous.state import (
    AgentInfo,
    InvalidRequestError,
    NotMemberError,
    Rendezvous,
    StaleRoundError,
    assign,
)

pytestmark = pytest.mark.timeout(30)


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def agent(
    i: int, *, local_ranks: int = 2, hint: int | None = None, node: str | None = None, port: int = 29500
) -> AgentInfo:
    return AgentInfo(
        agent_id=f"agent-{i}",
        node_id=node or f"node-{i}",
        local_ranks=local_ranks,
        host=f"10.0.0.{i}",
        free_port=port,
        node_rank_hint=hint,
    )


def ranks(rdzv: Rendezvous) -> dict[str, tuple[int, int]]:
    snapshot = rdzv.snapshot()
    assert snapshot.assignment is not None
    return {p.agent.agent_id: (p.group_rank, p.rank_offset) for p in snapshot.assignment.placements}


# -- rank order -----------------------------------------------------------------------------


def test_ranks_are_node_major_with_offsets_from_local_ranks() -> None:
    agents = [agent(1, local_ranks=4), agent(2, local_ranks=1), agent(3, local_ranks=3)]
    result = assign(7, agents)
    assert [(p.agent.agent_id, p.group_rank, p.rank_offset) for p in result.placements] == [
        ("agent-1", 0, 0),
        ("agent-2", 1, 4),
        ("agent-3", 2, 5),
    ]
    assert result.world_size == 8
    assert result.group_world_size == 3
    assert (result.master_addr, result.master_port) == ("10.0.0.1", 29500)
    assert result.by_agent["agent-3"].rank_offset == 5


def test_order_is_hint_then_node_then_agent_and_master_is_rank_zero() -> None:
    agents = [
        agent(1, node="b"),  # no hint: after every hinted agent
        agent(2, node="a"),  # no hint, node "a" sorts before node "b"
        agent(3, hint=1, node="z"),
        agent(4, hint=0, node="y", port=40000),
        AgentInfo("agent-0", "a", 2, "10.0.0.9", 1234),  # same node as agent-2: agent id breaks the tie
    ]
    result = assign(1, agents)
    assert [p.agent.agent_id for p in result.placements] == [
        "agent-4",
        "agent-3",
        "agent-0",
        "agent-2",
        "agent-1",
    ]
    assert (result.master_addr, result.master_port) == ("10.0.0.4", 40000)


@pytest.mark.parametrize("seed", range(5))
def test_assignment_does_not_depend_on_join_order(seed: int) -> None:
    agents = [agent(i, local_ranks=1 + i % 3, hint=i % 2 or None) for i in range(12)]
    expected: dict[str, tuple[int, int]] | None = None
    for _ in range(3):
        random.Random(seed).shuffle(agents)
        rdzv = Rendezvous(min_nodes=12, max_nodes=12)
        for a in agents:
            rdzv.join(a)
        got = ranks(rdzv)
        expected = expected or got
        assert got == expected


# -- completion -----------------------------------------------------------------------------


def test_completes_when_max_agents_joined() -> None:
    rdzv = Rendezvous(min_nodes=2, max_nodes=3, grace_s=60, clock=FakeClock())
    for i in range(2):
        assert rdzv.join(agent(i)).accepted
        assert not rdzv.snapshot().complete
    rdzv.join(agent(2))
    assert rdzv.snapshot().complete
    assert rdzv.view("agent-2", 1).placement is not None


def test_min_agents_complete_after_grace_on_the_clock() -> None:
    clock = FakeClock()
    rdzv = Rendezvous(min_nodes=2, max_nodes=4, grace_s=5, clock=clock)
    rdzv.join(agent(0))
    clock.now += 100  # time before reaching min does not count
    rdzv.join(agent(1))
    clock.now += 4.9
    assert not rdzv.view("agent-0", 1).complete
    rdzv.join(agent(2))  # joins during the grace period are in
    clock.now += 0.1
    view = rdzv.view("agent-0", 1)
    assert view.complete
    assert view.assignment is not None and view.assignment.group_world_size == 3


def test_grace_restarts_when_an_open_round_drops_below_min() -> None:
    clock = FakeClock()
    rdzv = Rendezvous(min_nodes=2, max_nodes=4, grace_s=5, clock=clock)
    rdzv.join(agent(0))
    rdzv.join(agent(1))
    clock.now += 4
    rdzv.leave("agent-1")
    rdzv.join(agent(2))
    clock.now += 4  # 8 s since min was first reached, 4 s since it was reached again
    assert not rdzv.snapshot().complete
    clock.now += 1
    assert rdzv.snapshot().complete


def test_zero_grace_completes_at_min() -> None:
    rdzv = Rendezvous(min_nodes=1, max_nodes=8, grace_s=0, clock=FakeClock())
    rdzv.join(agent(0))
    assert rdzv.snapshot().complete


# -- rounds ---------------------------------------------------------------------------------


def test_rejoining_a_complete_round_unchanged_is_a_no_op() -> None:
    rdzv = Rendezvous(min_nodes=2, max_nodes=2)
    rdzv.join(agent(0))
    rdzv.join(agent(1))
    before = rdzv.snapshot().assignment
    result = rdzv.join(agent(0))
    assert (result.round, result.accepted) == (1, True)
    assert rdzv.snapshot().assignment is before


def test_new_agent_after_completion_starts_a_round_that_expects_the_old_members() -> None:
    clock = FakeClock()
    rdzv = Rendezvous(min_nodes=2, max_nodes=4, grace_s=30, clock=clock)
    rdzv.join(agent(0))
    rdzv.join(agent(1))
    clock.now += 30
    assert rdzv.snapshot().complete

    assert rdzv.join(agent(2)).round == 2
    with pytest.raises(StaleRoundError, match="round 1 is not the current rendezvous round 2"):
        rdzv.view("agent-0", 1)
    with pytest.raises(StaleRoundError):
        rdzv.require_member("agent-1", 1)
    assert rdzv.snapshot().expected == {"agent-0", "agent-1", "agent-2"}
    rdzv.join(agent(0))
    assert not rdzv.snapshot().complete  # agent-1 not back yet, grace not over
    rdzv.join(agent(1))
    assert rdzv.snapshot().complete  # everyone expected is back: no grace wait
    assert set(ranks(rdzv)) == {"agent-0", "agent-1", "agent-2"}


def test_member_rejoining_with_a_changed_description_starts_a_new_round() -> None:
    rdzv = Rendezvous(min_nodes=2, max_nodes=2)
    rdzv.join(agent(0))
    rdzv.join(agent(1))
    assert rdzv.join(agent(1, port=31000)).round == 2  # a restarted agent with a new port
    rdzv.join(agent(0))
    assert rdzv.snapshot().complete
    assert rdzv.round == 2


def test_full_round_parks_spares_until_the_next_round() -> None:
    rdzv = Rendezvous(min_nodes=2, max_nodes=2)
    rdzv.join(agent(0))
    rdzv.join(agent(1))
    spare = rdzv.join(agent(2))
    assert (spare.round, spare.accepted) == (1, False)
    assert rdzv.view("agent-0", 1).waiting == 1
    with pytest.raises(NotMemberError):
        rdzv.view("agent-2", 1)

    assert rdzv.new_round(drop=["agent-1"]) == 2
    assert rdzv.snapshot().spares == ()
    assert rdzv.join(agent(2)).accepted
    rdzv.join(agent(0))
    assert set(ranks(rdzv)) == {"agent-0", "agent-2"}


def test_leaving_a_complete_round_starts_one_that_expects_the_rest() -> None:
    rdzv = Rendezvous(min_nodes=1, max_nodes=3, grace_s=60, clock=FakeClock())
    for i in range(3):
        rdzv.join(agent(i))
    assert rdzv.leave("agent-1") == 2
    assert rdzv.snapshot().expected == {"agent-0", "agent-2"}
    rdzv.join(agent(2))
    rdzv.join(agent(0))
    assert set(ranks(rdzv)) == {"agent-0", "agent-2"}
    assert rdzv.leave("agent-unknown") == 2


def test_leaving_an_open_round_lets_it_complete_with_the_others() -> None:
    rdzv = Rendezvous(min_nodes=1, max_nodes=3, grace_s=60, clock=FakeClock())
    for i in range(2):
        rdzv.join(agent(i))
    rdzv.new_round()  # round 2 expects agent-0 and agent-1
    rdzv.join(agent(0))
    assert not rdzv.snapshot().complete
    rdzv.leave("agent-1")  # the master saw it die
    assert rdzv.snapshot().complete
    assert set(ranks(rdzv)) == {"agent-0"}


def test_new_round_always_advances_and_refuses_the_old_round() -> None:
    rdzv = Rendezvous(min_nodes=2, max_nodes=2)
    rdzv.join(agent(0))
    assert rdzv.new_round() == 2  # even from an open round
    with pytest.raises(StaleRoundError) as info:
        rdzv.require_member("agent-0", 1)
    assert (info.value.requested, info.value.current) == (1, 2)
    with pytest.raises(StaleRoundError):
        rdzv.view("agent-0", 0)  # round 0 (an unset proto field) is never current


def test_non_member_is_refused() -> None:
    rdzv = Rendezvous(min_nodes=2, max_nodes=2)
    rdzv.join(agent(0))
    with pytest.raises(NotMemberError, match="'agent-9' is not a member of rendezvous round 1"):
        rdzv.require_member("agent-9", 1)


# -- waiting --------------------------------------------------------------------------------


def test_wait_complete_wakes_when_another_thread_completes_the_round() -> None:
    """The waiter returns once the round completes, not at its own (far) deadline."""
    rdzv = Rendezvous(min_nodes=2, max_nodes=2)
    rdzv.join(agent(0))
    results: list[object] = []
    waiting = threading.Event()

    def wait() -> None:
        waiting.set()
        results.append(rdzv.wait_complete(3600))

    waiter = threading.Thread(target=wait, daemon=True)
    waiter.start()
    assert waiting.wait(20)
    rdzv.join(agent(1))
    waiter.join(20)
    assert not waiter.is_alive(), "wait_complete did not return when the round completed"
    (result,) = results
    assert result is not None and getattr(result, "group_world_size", None) == 2


def test_wait_complete_times_out_and_notices_a_superseded_round() -> None:
    rdzv = Rendezvous(min_nodes=2, max_nodes=2)
    assert rdzv.wait_complete(0.05) is None
    rdzv.new_round()
    with pytest.raises(StaleRoundError):
        rdzv.wait_complete(1, round_=1)


# -- validation -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("agent_id", "", "agent_id is empty"),
        ("node_id", "", "node_id is empty"),
        ("host", "", "host is empty"),
        ("agent_id", "x" * 257, "limit is 256"),
        ("local_ranks", 0, "local_ranks must be in 1..1024"),
        ("local_ranks", -3, "local_ranks must be in 1..1024"),
        ("local_ranks", 5000, "local_ranks must be in 1..1024"),
        ("free_port", 0, "free_port must be in 1..65535"),
        ("free_port", 70000, "free_port must be in 1..65535"),
        ("node_rank_hint", -1, "node_rank_hint must be >= 0"),
    ],
)
def test_malformed_agents_are_rejected(field: str, value: object, message: str) -> None:
    fields: dict[str, object] = {
        "agent_id": "a",
        "node_id": "n",
        "local_ranks": 1,
        "host": "h",
        "free_port": 1,
        "node_rank_hint": None,
    }
    fields[field] = value
    with pytest.raises(InvalidRequestError, match=message):
        AgentInfo(**fields)  # type: ignore[arg-type]


@pytest.mark.parametrize(("min_nodes", "max_nodes", "grace_s"), [(0, 1, 0), (3, 2, 0), (1, 1, -1)])
def test_bad_configuration_is_rejected(min_nodes: int, max_nodes: int, grace_s: float) -> None:
    with pytest.raises(ValueError):
        Rendezvous(min_nodes=min_nodes, max_nodes=max_nodes, grace_s=grace_s)


# -- listeners (what the gRPC server's held calls wait on) -------------------------------------


def test_listeners_hear_completion_and_new_rounds_and_can_be_removed() -> None:
    clock = FakeClock()
    rdzv = Rendezvous(min_nodes=2, max_nodes=3, grace_s=5.0, clock=clock)
    heard: list[int] = []
    remove = rdzv.add_listener(lambda: heard.append(rdzv.snapshot().round))
    rdzv.join(agent(0))
    rdzv.join(agent(1))
    assert heard == []  # joins alone are not news: the round is still open
    clock.now += 5.0
    rdzv.refresh()  # the grace period ran out: refresh completes the round
    assert heard == [1] and rdzv.snapshot().complete
    rdzv.new_round()
    assert heard == [1, 2]
    remove()
    rdzv.new_round()
    assert heard == [1, 2]


def test_a_failing_listener_does_not_break_the_rendezvous() -> None:
    rdzv = Rendezvous(min_nodes=1, max_nodes=1)
    heard: list[str] = []

    def broken() -> None:
        raise RuntimeError("listener bug")

    rdzv.add_listener(broken)
    rdzv.add_listener(lambda: heard.append("ok"))
    assert rdzv.join(agent(0)).accepted
    assert rdzv.snapshot().complete and heard == ["ok"]


def test_settled_is_pending_then_the_agents_view_then_false_once_superseded() -> None:
    clock = FakeClock()
    rdzv = Rendezvous(min_nodes=1, max_nodes=3, grace_s=5.0, clock=clock)
    rdzv.join(agent(0))
    assert rdzv.settled("agent-0", 1) is None  # pending (min reached, grace running)
    assert rdzv.settled("agent-9", 1) is False  # never joined: must join, not wait
    assert rdzv.settled("agent-0", 2) is False  # a round that is not the current one
    clock.now += 5.0  # the grace period runs out: the next look completes the round
    view = rdzv.settled("agent-0", 1)
    assert view is not None and view is not False
    assert view == rdzv.view("agent-0", 1)  # the same view the polling path answers
    assert view.complete and view.placement is not None and view.placement.group_rank == 0
    rdzv.new_round()
    assert rdzv.settled("agent-0", 1) is False
