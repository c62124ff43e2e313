"""The ElasticMaster's side of ACTION_HALT, without Ray or gRPC: while the PrimeMaster judges a
rank's failure, every beat of that round is told to halt (its process ends whatever the verdict);
the verdict then decides: a new round (nothing pending), a stop (ACTION_STOP), or a failover
that will open the round (still halted); a report of a round already left halts nothing."""

from __future__ import annotations

import threading
import time

import pytest

from dlu.elastic.v1 import elastic_pb2 as pb
from dlu_api.vocabulary import InPlaceDecision, InPlaceVerdict
from dlu_elastic.blame import Report
from dlu_elastic.inplace_timer import InPlaceTimer
from dlu_elastic.master import ElasticMaster
from dlu_elastic.rendezvous.state import Rendezvous

pytestmark = pytest.mark.timeout(30)


class Server:
    def __init__(self) -> None:
        self.wakes = 0

    def wake_held(self) -> None:
        self.wakes += 1


def master(verdict: InPlaceVerdict) -> tuple[ElasticMaster, list[int], Server]:
    """An ElasticMaster whose PrimeMaster answers `verdict`, noting what beats were told while it judged."""
    m = object.__new__(ElasticMaster)
    m.role, m.job = "trainer", "job"
    m.rendezvous = Rendezvous(min_nodes=1, max_nodes=1)
    m._lock = threading.Lock()
    m._timer_lock = threading.Lock()
    m.stopping = False
    m.restarts = 0
    m.last_failure = ""
    m._joined_round = -1
    m._counted_round = -1
    m._halted_round = -1
    m._inplace = InPlaceTimer()
    server = Server()
    m.server = server  # type: ignore[assignment]
    m._ranks = lambda: ["job.trainer.0", "job.trainer.1"]  # type: ignore[method-assign]
    told: list[int] = []

    def judge(
        message: str, agent: str, error: str, recovered: bool = False, report_id: str | None = None
    ) -> InPlaceDecision:
        told.append(m._pending_action())
        if recovered:  # the PrimeMaster never answers RESTART for a round already left
            return InPlaceDecision(InPlaceVerdict.JOIN, "late", counted=True)
        return InPlaceDecision(verdict, "judged", counted=verdict is InPlaceVerdict.RESTART)

    m._note_inplace_restart = judge  # type: ignore[method-assign]
    return m, told, server


def report(m: ElasticMaster, round_: int | None = None) -> Report:
    return Report(
        m.rendezvous.round if round_ is None else round_, "job.trainer.1", 1, "boom", time.monotonic()
    )


def test_beats_are_told_to_halt_while_the_failure_is_judged_then_a_new_round_clears_it() -> None:
    m, told, server = master(InPlaceVerdict.RESTART)
    before = m.rendezvous.round
    m._restart_for(report(m))
    assert told == [pb.ACTION_HALT]
    assert server.wakes >= 1  # held beats heard it at once
    assert m.rendezvous.round == before + 1
    assert m._pending_action() == pb.ACTION_NONE


def test_a_stop_verdict_turns_the_halt_into_a_stop() -> None:
    m, told, _ = master(InPlaceVerdict.STOP)
    m._restart_for(report(m))
    assert told == [pb.ACTION_HALT]
    assert m._pending_action() == pb.ACTION_STOP


def test_a_join_verdict_keeps_the_round_halted_for_the_failover_that_will_open_the_next() -> None:
    m, _, _ = master(InPlaceVerdict.JOIN)
    before = m.rendezvous.round
    m._restart_for(report(m))
    assert m.rendezvous.round == before
    assert m._pending_action() == pb.ACTION_HALT
    m.rendezvous.new_round()  # the failover's round
    assert m._pending_action() == pb.ACTION_NONE


def test_a_peer_report_of_a_round_already_left_halts_nothing_and_is_not_judged() -> None:
    m, told, server = master(InPlaceVerdict.RESTART)
    stale = m.rendezvous.round
    m.rendezvous.new_round()
    peer = Report(stale, "job.trainer.1", 1, "RuntimeError: Connection closed by peer", time.monotonic())
    m._restart_for(peer)
    assert told == [] and server.wakes == 0
    assert m._pending_action() == pb.ACTION_NONE


def test_an_own_fault_of_a_round_already_left_is_counted_once_and_opens_no_round() -> None:
    """Defect 2 at the ElasticMaster: a hang found after a failover moved the round on is a fault
    of its own: judged (counted) once, recovered by the round under way: no halt, no new round."""
    m, told, server = master(InPlaceVerdict.RESTART)
    stale = m.rendezvous.round
    current = m.rendezvous.new_round()
    m._restart_for(report(m, stale))
    m._restart_for(report(m, stale))  # the same fault reported twice: counted once
    assert told == [pb.ACTION_NONE] and server.wakes == 0
    assert m.rendezvous.round == current and m._pending_action() == pb.ACTION_NONE


def test_an_own_fault_in_a_round_that_joined_a_failover_is_counted() -> None:
    m, told, _ = master(InPlaceVerdict.JOIN)
    m._restart_for(report(m))  # a peer's failure joined the failover in flight: round held
    m._restart_for(report(m))  # then a rank's own fault in that round: judged as a late fault
    assert len(told) == 2
