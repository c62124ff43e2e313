"""`dlu scale` and `dlu debug` ask a PrimeMaster that died with the request in flight again,
once Ray rebuilt it, with the same request id (launcher._ask_rebuilt, one loop for both)."""

from __future__ import annotations

import time
from typing import Any

import pytest
import ray
from ray.exceptions import RayActorError

from dlu_prime import launcher

pytestmark = pytest.mark.timeout(60)


class Master:
    """A PrimeMaster handle whose first `dies` calls fail as a dead actor's would."""

    def __init__(self, dies: int) -> None:
        self.dies = dies
        self.asked: list[tuple[Any, ...]] = []


def call_of(master: Master, answer: dict[str, Any]) -> Any:
    def call(handle: Master, *args: Any) -> dict[str, Any]:
        handle.asked.append(args)
        if len(handle.asked) <= handle.dies:
            raise RayActorError()
        return answer

    return call


@pytest.fixture
def master(monkeypatch: pytest.MonkeyPatch) -> Master:
    found = Master(dies=2)
    monkeypatch.setattr(launcher, "get_master", lambda job: found)
    monkeypatch.setattr(time, "sleep", lambda s: None)
    return found


def test_scale_asks_the_rebuilt_master_again_with_the_same_request_id(
    master: Master, monkeypatch: pytest.MonkeyPatch
) -> None:
    class Remote:
        def remote(self, *args: Any) -> tuple[Any, ...]:
            master.asked.append(args)
            if len(master.asked) <= master.dies:
                raise RayActorError()
            return args

    monkeypatch.setattr(master, "scale", Remote(), raising=False)
    monkeypatch.setattr(ray, "get", lambda ref, timeout=None: {"new_size": ref[1]})
    assert launcher.scale_job("job", "worker", 3) == {"new_size": 3}
    assert len(master.asked) == 3
    assert len({args[-1] for args in master.asked}) == 1  # one request id, asked three times


def test_debug_asks_again_too(master: Master, monkeypatch: pytest.MonkeyPatch) -> None:
    class Remote:
        def remote(self, *args: Any) -> tuple[Any, ...]:
            master.asked.append(args)
            if len(master.asked) <= master.dies:
                raise RayActorError()
            return args

    monkeypatch.setattr(master, "debug", Remote(), raising=False)
    monkeypatch.setattr(ray, "get", lambda ref, timeout=None: {"step": 7})
    assert launcher.debug_job("job", "get_step", "trainer", 0) == {"step": 7}
    assert len({args[-1] for args in master.asked}) == 1 and len(master.asked) == 3


def test_a_master_that_does_not_come_back_is_named(master: Master, monkeypatch: pytest.MonkeyPatch) -> None:
    clock = iter(range(0, 10_000, 50))
    monkeypatch.setattr(time, "monotonic", lambda: float(next(clock)))
    master.dies = 1_000
    with pytest.raises(LookupError, match="did not come back to answer `dlu scale`"):
        launcher._ask_rebuilt("job", "scale", "no master", call_of(master, {}), 100.0)  # pyright: ignore[reportPrivateUsage]


def test_no_master_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(launcher, "get_master", lambda job: None)
    with pytest.raises(LookupError, match="only a running job can be scaled"):
        launcher.scale_job("job", "worker", 3)
