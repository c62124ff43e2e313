"""How often a rank heartbeats: quick for small roles, bounded master load for large ones."""

from __future__ import annotations

import pytest

from dlu_elastic.worker.actor import HEARTBEAT_CALLS_PER_S, MIN_HEARTBEAT_INTERVAL_S, heartbeat_interval


@pytest.mark.parametrize("world", [1, 4, 8, 50])
def test_small_roles_beat_at_the_minimum_interval(world: int) -> None:
    assert heartbeat_interval(world) == MIN_HEARTBEAT_INTERVAL_S


@pytest.mark.parametrize("world", [100, 1000, 4000])
def test_large_roles_keep_the_master_under_its_call_rate(world: int) -> None:
    interval = heartbeat_interval(world)
    assert world / interval <= HEARTBEAT_CALLS_PER_S + 1e-9
    assert (
        interval > heartbeat_interval(world // 2)
        or world // 2 <= HEARTBEAT_CALLS_PER_S * MIN_HEARTBEAT_INTERVAL_S
    )
