"""The Ray scheduler's poll when calls to an actor are stranded on a process that died (Ray
fails them only after waiting 1 to 2 s for news of the death): the call is sent again after
RESEND_AFTER_S, and once the rebuilt actor reports itself (`renewed`) a call goes to the new
incarnation, whose answer counts. Ray's calls are scripted here (no Ray)."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from dlu_prime.scheduler import ray_scheduler
from dlu_prime.scheduler.ray_scheduler import RayScheduler

pytestmark = pytest.mark.timeout(30)

NAME = "job.trainer.3"
NEW = {"stage": "INIT", "reconstructed": True, "pid": 4242, "node_id": "n1"}


class Ref:
    def __init__(self, answer: dict[str, Any] | None) -> None:
        self.answer = answer  # None: never answered (stranded)


class Handle:
    """`status.remote()` of an actor whose first `stranded` calls never answer."""

    def __init__(self, stranded: int) -> None:
        self.sent: list[Ref] = []
        self.stranded = stranded
        self.status = self

    def remote(self) -> Ref:
        ref = Ref(None if len(self.sent) < self.stranded else NEW)
        self.sent.append(ref)
        return ref


def fake_wait(
    pending: list[Ref], num_returns: int = 1, timeout: float | None = None
) -> tuple[list[Ref], list[Ref]]:
    ready = [r for r in pending if r.answer is not None][:num_returns]
    if not ready:
        time.sleep(min(timeout or 0.0, 0.01))
    return ready, [r for r in pending if r not in ready]


@pytest.fixture
def scheduler(monkeypatch: pytest.MonkeyPatch) -> RayScheduler:
    monkeypatch.setattr(ray_scheduler.ray, "wait", fake_wait)
    monkeypatch.setattr(ray_scheduler.ray, "get", lambda ref, **_: ref.answer)
    found = object.__new__(RayScheduler)
    found._renewed = set()  # pyright: ignore[reportPrivateUsage]
    return found


def poll_in_thread(scheduler: RayScheduler) -> tuple[threading.Thread, dict[str, Any]]:
    out: dict[str, Any] = {}
    thread = threading.Thread(target=lambda: out.update(scheduler.poll([NAME])), daemon=True)
    thread.start()
    return thread, out


def wait_for(condition: Any, what: str) -> None:
    deadline = time.monotonic() + 20
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


def test_a_call_unanswered_for_a_while_is_sent_again_and_its_answer_counts(scheduler: RayScheduler) -> None:
    handle = Handle(stranded=1)
    scheduler._handles = {NAME: handle}  # pyright: ignore[reportPrivateUsage]
    seen = scheduler.poll([NAME])[NAME]
    assert len(handle.sent) == 2
    assert seen.reconstructed and not seen.unavailable


def test_a_rebuilt_actor_that_reports_itself_is_asked_at_once(scheduler: RayScheduler) -> None:
    handle = Handle(stranded=2)  # the resent call was stranded too (sent before Ray knew)
    scheduler._handles = {NAME: handle}  # pyright: ignore[reportPrivateUsage]
    thread, out = poll_in_thread(scheduler)
    wait_for(lambda: len(handle.sent) == 2, "the call to be sent again")
    assert thread.is_alive()  # both calls are stranded: the poll waits
    scheduler.renewed(NAME)
    thread.join(20)
    assert not thread.is_alive(), "the poll did not ask the new incarnation"
    assert len(handle.sent) == 3
    assert out[NAME].reconstructed and out[NAME].incarnation == "n1/4242"
