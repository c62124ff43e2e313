"""An agent joins a rendezvous round only once its node's zygote can fork (issue 27, defect 2).

Seen for real: after a peer's actor was SIGKILLed and rebuilt by Ray, the rebuilt agent joined
the failover's round at once while its new zygote still imported torch (20+ s on a loaded
machine). The round completed, the healthy rank's process started and waited in the process
group's init for a peer that did not exist yet, past its first-beat allowance: its agent killed
it as hung and the restart was counted on the healthy rank. Joining once ready keeps the peers
waiting in the rendezvous, where nothing is judged silent. Without Ray: a stub launcher and
client record the order of the calls.
"""

from __future__ import annotations

import threading
from types import SimpleNamespace
from typing import Any

import pytest

from dlu_elastic.worker.actor import ElasticWorkerActor

pytestmark = pytest.mark.timeout(30)


class Joined(Exception):
    """Ends the agent loop once it joined (what follows is not this test's)."""


class Launcher:
    def __init__(self, calls: list[str], fails: bool = False) -> None:
        self.calls = calls
        self.fails = fails

    def warm_up(self, timeout_s: float = 120.0) -> float:
        self.calls.append("warm_up")
        if self.fails:
            raise RuntimeError("the zygote did not answer within 1 s")
        return 0.0


class Client:
    def __init__(self, calls: list[str]) -> None:
        self.calls = calls

    def rendezvous(self, **_: Any) -> None:
        self.calls.append("rendezvous")
        raise Joined

    def close(self) -> None:
        self.calls.append("close")


def agent(calls: list[str], fails: bool = False) -> ElasticWorkerActor:
    actor = object.__new__(ElasticWorkerActor)
    actor.info = SimpleNamespace(  # type: ignore[assignment]
        actor_name="job.trainer.0", node_rank=0, local_world_size=1, local_rank=0
    )
    actor.node_id = "node"  # type: ignore[attr-defined]
    actor.host = "127.0.0.1"
    actor.elastic = SimpleNamespace(agent_store=False)  # type: ignore[assignment]
    actor._stop = threading.Event()  # type: ignore[attr-defined]
    actor._store = None
    actor._retired_store = None
    actor.process = None
    actor.launcher = Launcher(calls, fails)  # type: ignore[assignment]
    actor._connect = lambda: Client(calls)  # type: ignore[method-assign, assignment, return-value]
    return actor


def test_the_agent_joins_a_round_once_its_zygote_is_ready() -> None:
    calls: list[str] = []
    with pytest.raises(Joined):
        agent(calls)._train()
    assert calls[:2] == ["warm_up", "rendezvous"], calls


def test_a_zygote_that_does_not_answer_does_not_keep_the_agent_out_of_the_round() -> None:
    calls: list[str] = []
    with pytest.raises(Joined):
        agent(calls, fails=True)._train()  # its process start then tries (and reports) itself
    assert calls[:2] == ["warm_up", "rendezvous"], calls
