"""The PrimeMaster's poll of an actor whose process is killed while it answers: the status call
on its way to the dead process is failed by Ray only after a wait for news of the death (1 to 2
s), however soon Ray rebuilt the actor. The poll asks again and sees the new incarnation (so the
restart is judged at once, not reported as "restarting" for another pass)."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from lm_jobs import lm_job

pytestmark = [pytest.mark.ray, pytest.mark.timeout(120)]


def test_a_status_call_stranded_on_a_killed_process_is_answered_by_the_new_one(
    ray_session: Any, tmp_path: Path
) -> None:
    import ray

    from dlu_prime.naming import NAMESPACE
    from dlu_prime.scheduler.ray_scheduler import RayScheduler

    answering = tmp_path / "answering"

    class SlowToAnswer:  # defined here: Ray ships it by value (workers cannot import this module)
        """Its first incarnation never finishes a status call (it is killed in it)."""

        def __init__(self, flag: str) -> None:
            from dlu_prime import ray_private

            self.flag = flag
            self.reconstructed = ray_private.actor_was_restarted()

        def pid(self) -> int:
            return os.getpid()

        def status(self) -> dict[str, Any]:
            if not self.reconstructed:
                Path(self.flag).touch()
                time.sleep(3600)
            return {"stage": "INIT", "reconstructed": True, "pid": os.getpid()}

    spec = lm_job("stranded", tmp_path)
    name = "stranded.trainer.0"
    actor = (
        ray.remote(SlowToAnswer)  # pyright: ignore[reportUnknownMemberType]
        .options(name=name, namespace=NAMESPACE, num_cpus=0, max_concurrency=4, max_restarts=-1)
        .remote(str(answering))
    )
    try:
        first_pid = ray.get(actor.pid.remote(), timeout=60)
        scheduler = RayScheduler(spec)
        found: dict[str, Any] = {}
        polling = threading.Thread(target=lambda: found.update(scheduler.poll([name])))
        polling.start()
        deadline = time.monotonic() + 60
        while not answering.exists():
            assert time.monotonic() < deadline, "the status call never reached the actor"
            time.sleep(0.01)
        os.kill(first_pid, signal.SIGKILL)
        polling.join(60)
        assert not polling.is_alive()
        seen = found[name]
        assert not seen.unavailable, seen.error  # not "restarting": the new incarnation answered
        assert seen.reconstructed and seen.stage is not None and seen.stage.value == "INIT"
        assert seen.incarnation is not None and not seen.incarnation.endswith(f"/{first_pid}")
    finally:
        ray.kill(actor, no_restart=True)
