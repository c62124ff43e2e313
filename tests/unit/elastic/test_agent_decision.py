"""The agent's side of a restart, with a scripted master and process (no Ray, no gRPC): after
its process failed it waits for the decision with held beats (answered when the master decides,
not polled), a held beat cut off by the master's shutdown is no error, and the first beat of a
new process wakes the PrimeMaster once (the job's status shows training again at once); while
its process trains a beat is always held, so a new round opened for a peer's failure stops the
process at once; a failure the process announces is reported before its teardown ends."""

from __future__ import annotations

import threading
from types import SimpleNamespace
from typing import Any

import grpc
import pytest

from dlu.elastic.v1 import elastic_pb2 as pb
from dlu_api.spec.models import HealthSettings
from dlu_api.vocabulary import ActorStage
from dlu_elastic.rendezvous.client import RendezvousError
from dlu_elastic.worker.actor import ElasticWorkerActor
from dlu_elastic.worker.agent_loop import DECISION_HOLD_S, HEARTBEAT_TIMEOUT_S
from dlu_elastic.worker.process import ProcessEvent, ProcessEventKind
from dlu_prime.runtime.context import Health
from dlu_prime.worker.entrypoint import Outcome

pytestmark = pytest.mark.timeout(30)

STALE = RendezvousError(
    "Heartbeat", grpc.StatusCode.FAILED_PRECONDITION, "round 1 is not the current round 2"
)
CANCELLED = RendezvousError("Heartbeat", grpc.StatusCode.CANCELLED, "Cancelled on the server side")


class ScriptedMaster:
    """Answers heartbeats from a script (an action, or an error to raise), noting each call."""

    def __init__(self, answers: list[Any]) -> None:
        self.answers = answers
        self.calls: list[dict[str, Any]] = []
        self.reports: list[dict[str, Any]] = []
        self.address = "127.0.0.1:1"

    def report_failure(self, **call: Any) -> None:
        self.reports.append(call)

    def heartbeat(self, **call: Any) -> int:
        self.calls.append(call)
        answer = self.answers.pop(0) if self.answers else pb.ACTION_NONE
        if isinstance(answer, Exception):
            raise answer
        return int(answer)

    def heartbeat_async(self, **call: Any) -> AnsweredBeat:
        self.calls.append(call)
        return AnsweredBeat(self.answers.pop(0) if self.answers else pb.ACTION_NONE)


class AnsweredBeat:
    """A held beat whose answer is already in (the scripted master answers at once)."""

    def __init__(self, answer: Any) -> None:
        self.answer = answer
        self.cancelled = False

    def done(self) -> bool:
        return True

    def on_done(self, callback: Any) -> None:
        callback()

    def cancel(self) -> None:
        self.cancelled = True

    def action(self) -> int:
        if isinstance(self.answer, Exception):
            raise self.answer
        return int(self.answer)


class ScriptedProcess:
    """A training process that beats `steps` (one per look), then exits with `code`."""

    def __init__(self, steps: list[int], code: int | None, announced: int | None = None) -> None:
        self._steps = list(steps)
        self._code = code
        self._announced = announced  # a FAILURE event's code, the process still exiting
        self.pid = 12345
        self.spec = SimpleNamespace(env={"WORLD_SIZE": "4"})
        self.last_failure = "RuntimeError: boom" if code or announced else None
        self.activity = threading.Event()
        self.stop_requested = False

    def events(self) -> list[ProcessEvent]:
        if not self._steps:
            return []
        return [ProcessEvent(ProcessEventKind.HEARTBEAT, 0.0, step=self._steps.pop(0))]

    def poll(self) -> int | None:
        return None if self._steps else self._code

    def ending_code(self) -> int | None:
        code = self.poll()
        return code if code is not None else (None if self._steps else self._announced)

    def request_stop(self) -> None:
        self.stop_requested = True

    def terminate(self, grace_s: float = 5.0) -> int | None:
        return self._code


def agent(answers: list[Any]) -> tuple[ElasticWorkerActor, ScriptedMaster, list[str]]:
    """The agent part of an ElasticWorkerActor, without Ray: a rank in round 1."""
    actor = object.__new__(ElasticWorkerActor)
    actor.info = SimpleNamespace(actor_name="job.trainer.0", local_rank=0, job="job")  # type: ignore[assignment]
    actor.health = Health()
    actor._stop = threading.Event()  # type: ignore[attr-defined]
    actor._health = HealthSettings()
    actor._script_beats = False
    actor._store = None  # this rank's agent hosts no store
    actor.result = None
    actor.finished_at = None
    actor.stage = ActorStage.RUNNING
    master = ScriptedMaster(answers)
    actor._client = master  # type: ignore[assignment]
    wakes: list[str] = []
    actor._wake_master = lambda: wakes.append("wake")  # type: ignore[method-assign]
    actor._master_moved = lambda: False  # type: ignore[method-assign]
    return actor, master, wakes


def test_after_a_failure_the_agent_waits_for_the_decision_in_held_beats() -> None:
    actor, master, _ = agent([pb.ACTION_NONE, STALE])
    assert actor._wait_for_decision(1, 0.001) == "restart"
    assert [c["wait_s"] for c in master.calls] == [DECISION_HOLD_S, DECISION_HOLD_S]


def test_a_stop_decided_while_held_ends_the_wait() -> None:
    actor, _, _ = agent([pb.ACTION_STOP])
    assert actor._wait_for_decision(1, 0.001) == "stop"


def test_a_held_beat_cancelled_by_the_masters_shutdown_is_no_error() -> None:
    actor, master, _ = agent([CANCELLED, STALE])
    assert actor._wait_for_decision(1, 0.001) == "restart"
    assert len(master.calls) == 2


def test_a_cancelled_beat_that_was_not_held_is_still_an_error() -> None:
    actor, _, _ = agent([CANCELLED])
    with pytest.raises(RendezvousError):
        actor._beat(1)


def test_the_first_beat_of_a_process_wakes_the_prime_master_once() -> None:
    actor, master, wakes = agent([pb.ACTION_NONE] * 3 + [STALE])
    result = actor._watch(1, ScriptedProcess([16, 17, 18], code=1))  # type: ignore[arg-type]
    assert result is None  # the failure was reported, then the master restarted training
    assert wakes == ["wake"]
    assert [r["exit_code"] for r in master.reports] == [1]
    assert master.calls[0]["step"] == 16  # and the ElasticMaster heard of the step at once


def test_a_failed_process_is_reported_once_and_ends_the_rank_on_stop() -> None:
    actor, master, wakes = agent([pb.ACTION_STOP])
    result = actor._watch(1, ScriptedProcess([], code=1))  # type: ignore[arg-type]
    assert result is not None and result.outcome is Outcome.FAILED
    assert [r["exit_code"] for r in master.reports] == [1]
    assert wakes == []  # it never trained


def test_a_held_beat_answered_with_a_new_round_stops_the_process_at_once() -> None:
    """A surviving rank: its process still trains when a peer's failure opens a new round."""
    actor, master, _ = agent([STALE])
    process = ScriptedProcess([5, 6, 7, 8], code=None)
    assert actor._watch(1, process) is None  # type: ignore[arg-type]  # run again in the new round
    assert process.stop_requested
    assert master.reports == []  # not this rank's failure
    assert master.calls[0]["wait_s"] > 0  # the beat was a held one


def test_a_failure_announced_before_the_exit_is_reported_at_once_with_its_code() -> None:
    actor, master, _ = agent([STALE])
    process = ScriptedProcess([], code=None, announced=3)  # still in its exit hooks
    assert actor._watch(1, process) is None  # type: ignore[arg-type]
    assert [r["exit_code"] for r in master.reports] == [3]
    assert master.reports[0]["error"] == "RuntimeError: boom"


def test_a_finished_rank_waits_in_held_beats_after_its_first() -> None:
    actor, master, _ = agent([pb.ACTION_NONE, pb.ACTION_NONE, STALE])
    assert actor._finished(1, 0.001) is None  # rerun: a peer failed after this rank finished
    assert [c["wait_s"] > 0 for c in master.calls] == [False, True, True]


HALT = pb.ACTION_HALT


def test_a_halt_stops_the_process_and_waits_idle_for_the_decision() -> None:
    """A peer failed and the master is deciding: this rank's process is stopped at once (every
    decision ends it), nothing is reported as this rank's failure, and the decision is awaited
    in idle held beats (a halt is no news to them)."""
    actor, master, _ = agent([HALT, STALE])
    process = ScriptedProcess([5, 6, 7, 8], code=None)
    assert actor._watch(1, process) is None  # type: ignore[arg-type]  # the new round came
    assert process.stop_requested
    assert master.reports == []
    assert [c.get("idle", False) for c in master.calls] == [False, True]


def test_a_halt_then_a_stop_ends_the_rank() -> None:
    actor, _, _ = agent([HALT, pb.ACTION_STOP])
    result = actor._watch(1, ScriptedProcess([5, 6, 7, 8], code=None))  # type: ignore[arg-type]
    assert result is not None and result.outcome is Outcome.FAILED


class HungProcess(ScriptedProcess):
    """Beats once, then is silent and running (stopped: never seen waiting); notes its kill."""

    def __init__(self, log: list[str]) -> None:
        super().__init__([5], code=None)
        self.log = log
        self.killed = False

    def poll(self) -> int | None:
        return -9 if self.killed else None

    def ending_code(self) -> int | None:
        return self.poll()

    def terminate(self, grace_s: float = 5.0) -> int | None:
        self.log.append("kill")
        self.killed = True
        return -9


def test_a_hung_process_is_reported_before_it_is_killed(monkeypatch: pytest.MonkeyPatch) -> None:
    """Killing a hung rank fails its peers' collectives: they wake up running and silent, so
    its failure must reach the master (which halts them) before the kill, not after."""
    monkeypatch.setattr("dlu_elastic.worker.agent_loop.process_state", lambda pid: "T")
    actor, master, _ = agent([pb.ACTION_NONE, STALE])  # one beat in its watch, then the decision
    actor._health = HealthSettings(heartbeat_timeout_s=0.05)
    log: list[str] = []
    master.report_failure = lambda **call: (log.append("report"), master.reports.append(call))  # type: ignore[method-assign]
    process = HungProcess(log)
    assert actor._watch(1, process) is None  # type: ignore[arg-type]  # restarted in a new round
    assert log == ["report", "kill"]
    assert master.reports[0]["exit_code"] == -9
    assert "sent no heartbeat" in master.reports[0]["error"]


GONE = RendezvousError("Heartbeat", grpc.StatusCode.UNAVAILABLE, "failed to connect to all addresses")
PENDING = object()  # a held beat to a dead address: it waits out its whole deadline


class PendingBeat(AnsweredBeat):
    def done(self) -> bool:
        return False

    def on_done(self, callback: Any) -> None:
        pass


class LostMaster(ScriptedMaster):
    """Beats answered from a script where PENDING never comes back; the endpoint moves after
    `moves_after` lookups."""

    def heartbeat_async(self, **call: Any) -> AnsweredBeat:
        self.calls.append(call)
        answer = self.answers.pop(0) if self.answers else PENDING
        return PendingBeat(None) if answer is PENDING else AnsweredBeat(answer)


def lost_master_agent(
    answers: list[Any], moves_after: int | None
) -> tuple[ElasticWorkerActor, LostMaster, list[str]]:
    actor, _, _ = agent([])
    master = LostMaster(answers)
    actor._client = master  # type: ignore[assignment]
    lookups: list[str] = []

    def moved() -> bool:
        lookups.append("lookup")
        return moves_after is not None and len(lookups) > moves_after

    actor._master_moved = moved  # type: ignore[method-assign]
    return actor, master, lookups


def test_a_lost_master_is_looked_up_while_the_beat_to_its_address_waits() -> None:
    """The ElasticMaster died: the rank finds its replacement by lookups, not after the beat
    sent to the dead address has waited out its deadline."""
    actor, master, lookups = lost_master_agent([GONE], moves_after=8)  # moved after ~0.8 s
    process = ScriptedProcess([5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16], code=None)
    assert actor._watch(1, process) is None  # type: ignore[arg-type]  # join the new master's round
    assert process.stop_requested
    assert len(lookups) == 9  # one when the beat failed, then every lookup interval until it moved
    assert len(master.calls) == 2  # the failed beat, and the next one still waiting (never answered)
    assert master.reports == []


def test_a_beat_answered_again_ends_the_lookups() -> None:
    """A blip: the old master answers again, so the rank stops looking for a new one."""
    actor, _, lookups = lost_master_agent([GONE, pb.ACTION_NONE, pb.ACTION_NONE, STALE], moves_after=None)
    process = ScriptedProcess(list(range(100)), code=None)
    assert actor._watch(1, process) is None  # type: ignore[arg-type]  # the STALE beat: a new round
    assert actor._master_gone_at is None
    assert 1 <= len(lookups) <= 8  # within the beat interval that followed the failed beat, no more


def test_a_failure_reported_to_a_lost_master_waits_for_its_replacement() -> None:
    """The report gets the short heartbeat timeout (not the client's 10 s on a dead address),
    then the rank waits for the new master and joins its round."""
    actor, master, lookups = lost_master_agent([], moves_after=2)
    reports: list[dict[str, Any]] = []

    def report_failure(**call: Any) -> None:
        reports.append(call)
        raise GONE

    master.report_failure = report_failure  # type: ignore[method-assign]
    assert actor._failed(1, ScriptedProcess([], code=1), 1, None, 0.5) is None  # type: ignore[arg-type]
    assert [r["timeout_s"] for r in reports] == [HEARTBEAT_TIMEOUT_S]
    assert len(lookups) == 3


def test_a_failure_while_the_master_is_lost_follows_the_peers_to_the_new_master() -> None:
    """The ElasticMaster died, its replacement is up and the peers left for its round, so this
    rank's process failed on their broken connections: no report (it is no fault of this rank,
    and the dead address would hold the call), the rank joins the new round."""
    actor, master, lookups = lost_master_agent([], moves_after=0)
    actor._master_gone_at = 1.0
    assert actor._failed(1, ScriptedProcess([], code=1), 1, None, 0.5) is None  # type: ignore[arg-type]
    assert master.reports == []
    assert len(lookups) == 1
