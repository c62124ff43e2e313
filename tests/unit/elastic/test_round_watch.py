"""Held calls (`RoundWatch`) on a real event loop, without gRPC: woken by a round completing
from another thread, answered by their deadline slot, and one cancelled call leaves the others
held (they share a slot, not a future)."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

import pytest

from dlu_elastic.rendezvous.round_watch import RECHECK_S, RoundWatch
from dlu_elastic.rendezvous.state import AgentInfo, Assignment, Rendezvous

pytestmark = pytest.mark.timeout(30)

_T = TypeVar("_T")


def agent(i: int) -> AgentInfo:
    return AgentInfo(
        agent_id=f"agent-{i}", node_id=f"node-{i}", local_ranks=2, host="10.0.0.1", free_port=29500
    )


def run(body: Callable[[RoundWatch, Rendezvous], Awaitable[_T]], rendezvous: Rendezvous) -> _T:
    async def main() -> _T:
        watch = RoundWatch(rendezvous, asyncio.get_running_loop())
        try:
            return await body(watch, rendezvous)
        finally:
            watch.close()

    return asyncio.run(main())


def assignment_of(rendezvous: Rendezvous) -> Callable[[], Assignment | None]:
    return lambda: rendezvous.snapshot().assignment


def test_held_calls_wake_when_another_thread_completes_the_round() -> None:
    async def body(watch: RoundWatch, rendezvous: Rendezvous) -> list[Assignment | None]:
        rendezvous.join(agent(0))
        held = [asyncio.ensure_future(watch.until(assignment_of(rendezvous), 20.0)) for _ in range(50)]
        await asyncio.sleep(0.01)
        assert watch.held == 50
        started = time.monotonic()
        threading.Thread(target=rendezvous.join, args=(agent(1),)).start()  # the round completes
        answers = await asyncio.gather(*held)
        assert time.monotonic() - started < 10.0  # woken by the change, far before the 20 s deadline
        assert watch.held == 0
        return answers

    answers = run(body, Rendezvous(min_nodes=2, max_nodes=2))
    assert all(a is not None and a.group_world_size == 2 for a in answers)


def test_a_held_call_is_answered_within_its_deadline_and_at_most_one_slot_early() -> None:
    async def body(watch: RoundWatch, rendezvous: Rendezvous) -> tuple[object, float]:
        started = time.monotonic()
        answer = await watch.until(assignment_of(rendezvous), 0.3)
        return answer, time.monotonic() - started

    answer, held_s = run(body, Rendezvous(min_nodes=2, max_nodes=2))
    assert answer is None
    # never more than one slot before its deadline; answered at all (a loaded machine may be late)
    assert 0.3 - RECHECK_S - 0.01 <= held_s < 10.0


def test_a_zero_wait_answers_at_once() -> None:
    async def body(watch: RoundWatch, rendezvous: Rendezvous) -> object:
        return await watch.until(assignment_of(rendezvous), 0.0)

    assert run(body, Rendezvous(min_nodes=2, max_nodes=2)) is None


def test_cancelling_one_held_call_leaves_the_others_held_and_woken() -> None:
    async def body(watch: RoundWatch, rendezvous: Rendezvous) -> list[Assignment | None]:
        rendezvous.join(agent(0))
        held = [asyncio.ensure_future(watch.until(assignment_of(rendezvous), 20.0)) for _ in range(3)]
        await asyncio.sleep(0.01)
        held[0].cancel()  # its client went away: gRPC cancels the handler's task
        await asyncio.sleep(0.01)
        assert held[0].cancelled()
        assert not held[1].done() and not held[2].done()
        assert watch.held == 2
        rendezvous.join(agent(1))
        return await asyncio.gather(held[1], held[2])

    answers = run(body, Rendezvous(min_nodes=2, max_nodes=2))
    assert all(a is not None for a in answers)


def test_the_grace_period_completes_a_held_round_without_any_join() -> None:
    async def body(watch: RoundWatch, rendezvous: Rendezvous) -> Assignment | None:
        rendezvous.join(agent(0))
        return await watch.until(assignment_of(rendezvous), 10.0)  # the ticker's refresh sees it

    answer = run(body, Rendezvous(min_nodes=1, max_nodes=2, grace_s=0.1))
    assert answer is not None and answer.group_world_size == 1


def test_a_round_moving_on_wakes_held_calls_that_then_keep_waiting() -> None:
    async def body(watch: RoundWatch, rendezvous: Rendezvous) -> tuple[Assignment | None, int]:
        rendezvous.join(agent(0))
        checks = 0

        def second_round_complete() -> Assignment | None:
            nonlocal checks
            checks += 1
            snapshot = rendezvous.snapshot()
            return snapshot.assignment if snapshot.round == 2 else None

        held = asyncio.ensure_future(watch.until(second_round_complete, 20.0))
        await asyncio.sleep(0.01)
        rendezvous.join(agent(1))  # round 1 completes: woken, not ready, waits again
        await asyncio.sleep(0.05)
        assert not held.done()
        rendezvous.new_round()  # the master restarts training: round 2 expects both again
        await asyncio.sleep(0.05)
        assert not held.done()
        rendezvous.join(agent(1))
        rendezvous.join(agent(0))
        return await held, checks

    answer, checks = run(body, Rendezvous(min_nodes=2, max_nodes=2))
    assert answer is not None and answer.round == 2 and answer.group_world_size == 2
    assert checks >= 4  # checked at the start and after each change
