"""Held heartbeats over real gRPC on 127.0.0.1: an agent whose training process failed asks with
`wait_s` and hears the master's decision the moment it is made (a new round, a stop), not at its
next beat; with nothing decided it is answered ACTION_NONE when its wait ends."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import grpc
import pytest
from test_rendezvous_grpc import TOKEN, Hooks, Master, expect_status, form_round, held_calls, wait_until

from dlu.elastic.v1 import elastic_pb2 as pb
from dlu_elastic.rendezvous.client import RendezvousError
from dlu_elastic.rendezvous.service import ElasticServicer, serve
from dlu_elastic.rendezvous.state import Rendezvous

pytestmark = pytest.mark.timeout(60)


class Pending:
    """The master's pending decision, as the ElasticMaster's `stopping` flag gives it."""

    def __init__(self) -> None:
        self.action: int = pb.ACTION_NONE

    def __call__(self) -> int:
        return self.action


def start(pending: Pending) -> Master:
    rendezvous = Rendezvous(min_nodes=2, max_nodes=2)
    hooks = Hooks()
    servicer = ElasticServicer(rendezvous, on_heartbeat=hooks.on_heartbeat, pending_action=pending)
    return Master(rendezvous, hooks, serve("127.0.0.1", 0, token=TOKEN, servicer=servicer))


def held_beat(master: Master, round_: int, wait_s: float) -> pb.Action:
    with master.client(timeout_s=5.0) as client:
        return client.heartbeat(round=round_, agent_id="agent-0", step=3, wait_s=wait_s)


def test_a_held_beat_is_refused_as_stale_the_moment_a_new_round_starts() -> None:
    master = start(Pending())
    try:
        round_ = form_round(master)
        with ThreadPoolExecutor(1) as pool:
            held = pool.submit(held_beat, master, round_, 30.0)
            wait_until("the beat to be held", lambda: held_calls(master) == 1)
            assert not held.done()
            asked = time.monotonic()
            master.rendezvous.new_round()
            with pytest.raises(RendezvousError) as info:
                held.result(timeout=10)
            assert time.monotonic() - asked < 10  # far inside the 30 s it asked to be held
        assert info.value.code == grpc.StatusCode.FAILED_PRECONDITION
        assert len(master.hooks.heartbeats) == 1  # the beat itself was recorded once
    finally:
        master.server.stop(0)


def test_a_held_beat_hears_a_stop_when_the_master_wakes_it() -> None:
    pending = Pending()
    master = start(pending)
    try:
        round_ = form_round(master)
        with ThreadPoolExecutor(1) as pool:
            held = pool.submit(held_beat, master, round_, 30.0)
            wait_until("the beat to be held", lambda: held_calls(master) == 1)
            pending.action = pb.ACTION_STOP
            master.server.wake_held()
            assert held.result(timeout=10) == pb.ACTION_STOP
    finally:
        master.server.stop(0)


def test_a_held_beat_with_nothing_decided_answers_none_when_its_wait_ends() -> None:
    master = start(Pending())
    try:
        round_ = form_round(master)
        asked = time.monotonic()
        assert held_beat(master, round_, 0.3) == pb.ACTION_NONE
        assert time.monotonic() - asked >= 0.25  # it was held, not answered at once
        assert held_calls(master) == 0
    finally:
        master.server.stop(0)


def test_a_beat_the_hook_answers_is_not_held() -> None:
    master = start(Pending())
    master.hooks.action = pb.ACTION_RESTART
    try:
        round_ = form_round(master)
        asked = time.monotonic()
        assert held_beat(master, round_, 30.0) == pb.ACTION_RESTART
        assert time.monotonic() - asked < 10
    finally:
        master.server.stop(0)


@pytest.mark.parametrize("wait_s", [-1.0, float("nan"), float("inf")])
def test_a_bad_heartbeat_wait_is_invalid_argument(wait_s: float) -> None:
    master = start(Pending())
    try:
        round_ = form_round(master)
        error = expect_status(grpc.StatusCode.INVALID_ARGUMENT, lambda: held_beat(master, round_, wait_s))
        assert "wait_s" in error.details
    finally:
        master.server.stop(0)


def test_a_beat_sent_without_blocking_hears_the_new_round_and_a_cancelled_one_is_let_go() -> None:
    """What a rank's agent does while its process trains: one beat always held, answered the
    moment a peer's failure opens a new round; the beat it gives up is no longer held."""
    master = start(Pending())
    try:
        round_ = form_round(master)
        with master.client(timeout_s=5.0) as client:
            given_up = client.heartbeat_async(round=round_, agent_id="agent-1", step=2, wait_s=30.0)
            wait_until("the beat to be held", lambda: held_calls(master) == 1)
            given_up.cancel()
            wait_until("the cancelled beat to be let go", lambda: held_calls(master) == 0)

            woken: list[float] = []
            beat = client.heartbeat_async(round=round_, agent_id="agent-0", step=3, wait_s=30.0)
            beat.on_done(lambda: woken.append(time.monotonic()))
            wait_until("the beat to be held", lambda: held_calls(master) == 1)
            assert not beat.done()
            asked = time.monotonic()
            master.rendezvous.new_round()
            with pytest.raises(RendezvousError) as info:
                beat.action()
            assert info.value.code == grpc.StatusCode.FAILED_PRECONDITION
            assert woken and woken[0] - asked < 10  # far inside the 30 s it asked to be held
    finally:
        master.server.stop(0)


def test_a_halt_reaches_a_rank_that_trains_and_not_one_that_is_idle() -> None:
    """While a failure is decided the master answers ACTION_HALT: a held beat of a rank whose
    process runs hears it at once; an idle rank's held beat stays held for the decision."""
    pending = Pending()
    master = start(pending)
    try:
        round_ = form_round(master)
        with master.client(timeout_s=5.0) as client:
            training = client.heartbeat_async(round=round_, agent_id="agent-0", step=3, wait_s=30.0)
            with ThreadPoolExecutor(1) as pool:
                idle = pool.submit(
                    client.heartbeat, round=round_, agent_id="agent-1", step=3, wait_s=30.0, idle=True
                )
                wait_until("both beats to be held", lambda: held_calls(master) == 2)
                pending.action = pb.ACTION_HALT
                master.server.wake_held()
                assert training.action() == pb.ACTION_HALT
                wait_until("the idle beat to be held again", lambda: held_calls(master) == 1)
                assert not idle.done()
                master.rendezvous.new_round()  # the decision: a new round
                with pytest.raises(RendezvousError) as info:
                    idle.result(timeout=10)
                assert info.value.code == grpc.StatusCode.FAILED_PRECONDITION
    finally:
        master.server.stop(0)


def test_stopping_the_master_answers_held_beats_instead_of_spending_its_grace_on_them() -> None:
    """Every training rank has a beat held: a master stopping with a grace period (the job's
    end) answers them at once (nothing decided) and stops, instead of waiting out the holds."""
    master = start(Pending())
    round_ = form_round(master)
    with master.client(timeout_s=5.0) as client:
        beat = client.heartbeat_async(round=round_, agent_id="agent-0", step=3, wait_s=55.0)
        wait_until("the beat to be held", lambda: held_calls(master) == 1)
        with ThreadPoolExecutor(1) as pool:
            stopping = pool.submit(master.server.stop, 55.0)
            # far inside the beat's 55 s hold and the server's 55 s grace
            wait_until("the held beat to be answered", beat.done, timeout_s=15.0)
            assert beat.action() == pb.ACTION_NONE  # answered, not cut off
            stopping.result(timeout=15)
