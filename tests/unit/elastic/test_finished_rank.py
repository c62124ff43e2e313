"""A rank whose process exited 0 stays in its round and runs again when a peer's failure opens
a new one (torchrun restarts the whole group), in either order; it ends only when training
does. The pure rule (`after_success`), then the agent's loop on it with a scripted master."""

from __future__ import annotations

import threading
from types import SimpleNamespace
from typing import Any

import grpc
import pytest

from dlu.elastic.v1 import elastic_pb2 as pb
from dlu_api.vocabulary import ActorStage
from dlu_elastic.rendezvous.client import RendezvousError
from dlu_elastic.worker.actor import ElasticWorkerActor
from dlu_elastic.worker.finished import AfterSuccess, after_success
from dlu_prime.runtime.context import Health
from dlu_prime.worker.entrypoint import Outcome

STALE = RendezvousError(
    "Heartbeat", grpc.StatusCode.FAILED_PRECONDITION, "round 1 is not the current round 2"
)


def test_a_new_round_reruns_a_finished_rank_a_stop_ends_it_and_otherwise_it_waits() -> None:
    assert after_success("restart") is AfterSuccess.RERUN
    assert after_success("stop") is AfterSuccess.DONE
    assert after_success("none") is AfterSuccess.WAIT
    with pytest.raises(ValueError, match="unknown ElasticMaster action 'later'"):
        after_success("later")


class ScriptedMaster:
    """Answers the agent's heartbeats from a script (an action, or an error to raise) and notes
    the stage the rank showed at each beat."""

    def __init__(self, actor: ElasticWorkerActor, answers: list[Any]) -> None:
        self.actor = actor
        self.answers = answers
        self.stages_seen: list[ActorStage] = []

    def heartbeat(self, **_: Any) -> int:
        self.stages_seen.append(self.actor.stage)
        answer = self.answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return int(answer)


def finished_agent(answers: list[Any]) -> tuple[ElasticWorkerActor, ScriptedMaster]:
    """The agent part of an ElasticWorkerActor, without Ray: a rank running in round 1."""
    actor = object.__new__(ElasticWorkerActor)
    actor.info = SimpleNamespace(actor_name="job.trainer.0", local_rank=0, job="job")  # type: ignore[assignment]
    actor.health = Health()
    actor._stop = threading.Event()  # type: ignore[attr-defined]
    actor.result = None
    actor.finished_at = None
    actor.stage = ActorStage.RUNNING
    master = ScriptedMaster(actor, answers)
    actor._client = master  # type: ignore[assignment]
    return actor, master


def test_finished_rank_shows_finish_then_runs_again_when_a_peer_fails() -> None:
    actor, master = finished_agent([pb.ACTION_NONE, pb.ACTION_NONE, STALE])
    assert actor._finished(1, 0.001) is None  # run again
    assert master.stages_seen == [ActorStage.RUNNING, ActorStage.FINISH, ActorStage.FINISH]
    assert actor.stage is ActorStage.RUNNING and actor.result is None and actor.finished_at is None


def test_rank_finishing_while_a_restart_is_under_way_runs_again_without_showing_finish() -> None:
    actor, master = finished_agent([STALE])
    assert actor._finished(1, 0.001) is None
    assert master.stages_seen == [ActorStage.RUNNING]
    assert actor.stage is ActorStage.RUNNING


def test_restart_request_of_the_master_reruns_a_finished_rank() -> None:
    actor, _ = finished_agent([pb.ACTION_NONE, pb.ACTION_RESTART])
    assert actor._finished(1, 0.001) is None
    assert actor.stage is ActorStage.RUNNING


def test_training_stopped_by_the_master_ends_a_finished_rank_with_its_success() -> None:
    actor, master = finished_agent([pb.ACTION_NONE, pb.ACTION_STOP])
    result = actor._finished(1, 0.001)
    assert result is not None and result.outcome is Outcome.SUCCESS
    assert actor.stage is ActorStage.FINISH and actor.finished_at is not None
    assert master.answers == []


def test_an_unexpected_refusal_keeps_the_success() -> None:
    refused = RendezvousError("Heartbeat", grpc.StatusCode.INVALID_ARGUMENT, "agent_id is empty")
    actor, _ = finished_agent([pb.ACTION_NONE, refused])
    result = actor._finished(1, 0.001)
    assert result is not None and result.outcome is Outcome.SUCCESS


def test_a_stopped_actor_stops_waiting() -> None:
    actor, master = finished_agent([pb.ACTION_NONE] * 1000)
    stopper = threading.Timer(0.05, actor._stop.set)  # type: ignore[attr-defined]
    stopper.start()
    result = actor._finished(1, 0.001)
    stopper.join()
    assert result is not None and result.outcome is Outcome.SUCCESS
    assert actor.stage is ActorStage.FINISH and len(master.answers) < 1000


GONE = RendezvousError("Heartbeat", grpc.StatusCode.UNAVAILABLE, "connection refused")


def moved_master_agent(new_answers: list[Any]) -> tuple[ElasticWorkerActor, ScriptedMaster]:
    """A finished rank whose ElasticMaster dies after its first answer; the lookup that follows
    finds the replacement, which answers from `new_answers`."""
    actor, _ = finished_agent([pb.ACTION_NONE, GONE])
    replacement = ScriptedMaster(actor, new_answers)

    def moved() -> bool:
        actor._client = replacement  # type: ignore[assignment]
        actor._master_moves += 1
        return True

    actor._master_moved = moved  # type: ignore[method-assign]
    return actor, replacement


def test_a_finished_rank_asks_a_replaced_master_and_stops_if_training_is_over() -> None:
    """Every rank had finished when the master was replaced: the new master says stop, and the
    rank keeps its success instead of running again."""
    actor, replacement = moved_master_agent([pb.ACTION_STOP])
    result = actor._finished(1, 0.001)
    assert result is not None and result.outcome is Outcome.SUCCESS
    assert actor.training_ended and actor.stage is ActorStage.FINISH
    assert replacement.stages_seen == [ActorStage.FINISH]


def test_a_finished_rank_runs_again_when_the_replaced_master_refuses_its_round() -> None:
    """A peer still trained when the master was replaced: the new master knows nothing of the
    old round, so the rank joins its round and runs again (torchrun's semantics)."""
    actor, replacement = moved_master_agent([STALE])
    assert actor._finished(1, 0.001) is None
    assert not actor.training_ended and actor.stage is ActorStage.RUNNING
    assert replacement.answers == []


def _beat(agent_id: str, round_: int, idle: bool) -> pb.HeartbeatRequest:
    return pb.HeartbeatRequest(agent_id=agent_id, round=round_, step=3, timestamp=1.0, idle=idle)


@pytest.mark.parametrize("over", [False, True])
def test_a_master_whose_role_finished_tells_idle_agents_of_any_round_to_stop(over: bool) -> None:
    from dlu_elastic.rendezvous.servicer import ElasticServicer
    from dlu_elastic.rendezvous.state import Rendezvous, StaleRoundError

    servicer = ElasticServicer(Rendezvous(min_nodes=2, max_nodes=2, grace_s=1.0), training_over=over)
    old_round = _beat("job.trainer.0", 7, idle=True)  # a round of the master it replaced
    if over:
        assert servicer.heartbeat(old_round).action == pb.ACTION_STOP
        decided = servicer.decision(old_round)
        assert decided is not None and decided.action == pb.ACTION_STOP
    else:
        with pytest.raises(StaleRoundError):
            servicer.heartbeat(old_round)
    with pytest.raises(StaleRoundError):  # a training agent is never told so: it is not finished
        servicer.heartbeat(_beat("job.trainer.0", 7, idle=False))
