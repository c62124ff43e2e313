"""An actor tells a restart by Ray from its first start (dlu_prime.ray_private), without warnings."""

from __future__ import annotations

from typing import Any

import pytest

pytestmark = [pytest.mark.ray, pytest.mark.timeout(120)]


def test_a_restart_by_ray_is_seen(ray_session: Any) -> None:
    import ray

    class Probe:  # defined here: Ray ships it by value (workers cannot import this test module)
        def restarted(self) -> tuple[bool, list[str]]:
            import warnings

            from dlu_prime import ray_private

            with warnings.catch_warnings(record=True) as seen:
                warnings.simplefilter("always")
                found = ray_private.actor_was_restarted()
            return found, [str(w.message) for w in seen]

    probe: Any = ray.remote(max_restarts=1, max_task_retries=-1, num_cpus=0)(Probe).remote()
    assert ray.get(probe.restarted.remote(), timeout=60) == (False, [])
    ray.kill(probe, no_restart=False)
    assert ray.get(probe.restarted.remote(), timeout=60) == (True, [])
    ray.kill(probe)
