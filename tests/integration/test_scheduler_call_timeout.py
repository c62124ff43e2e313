"""The Ray scheduler's calls end at their deadline: a SubMaster that never answers its
`failover` call fails it with a timeout the PrimeManager escalates (tests/unit/prime/
test_sub_master_round_trip.py), instead of holding the monitoring loop forever."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
from lm_jobs import lm_job

from dlu_prime.scheduler.base import ActorSetupError

pytestmark = [pytest.mark.ray, pytest.mark.timeout(120)]


def test_a_call_past_its_timeout_raises_naming_the_actor(ray_session: Any, tmp_path: Path) -> None:
    import ray

    from dlu_prime.naming import NAMESPACE
    from dlu_prime.scheduler.ray_scheduler import RayScheduler

    class Stuck:  # defined here: Ray ships it by value (workers cannot import this module)
        def failover(self, names: list[str], reason: str) -> None:
            time.sleep(3600)

        def ready(self) -> bool:
            return True

    spec = lm_job("call-timeout", tmp_path)
    name = "call-timeout.trainer.submaster"
    actor = ray.remote(Stuck).options(name=name, namespace=NAMESPACE, num_cpus=0, max_concurrency=4).remote()  # pyright: ignore[reportUnknownMemberType]
    try:
        assert ray.get(actor.ready.remote(), timeout=60)
        with pytest.raises(ActorSetupError) as raised:
            RayScheduler(spec).call(name, "failover", ["call-timeout.trainer.1"], "test", timeout_s=1.0)
        assert raised.value.actor == name
        assert "GetTimeout" in raised.value.error
    finally:
        ray.kill(actor)
