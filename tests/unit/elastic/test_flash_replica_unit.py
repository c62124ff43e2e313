"""Flash checkpoint replicas in one process (no Ray; the buddy agent is a folder): the ring of
buddies, the replicator copying each newly completed slot, its failures (an event once per run
of failures, then retries), an idle soak, and load()'s plan of which rank restores from whom."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import torch

from dlu_elastic.checkpoint import FlashCheckpointer, replica, replica_load, shm

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(autouse=True)
def _world_of_one(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "1")
    monkeypatch.setenv(shm.ROOT_ENV, str(tmp_path / "shm"))
    (tmp_path / "shm").mkdir()


def state(step: int) -> dict[str, torch.Tensor]:
    return {
        "w": torch.arange(10, dtype=torch.float64) * step,
        "h": torch.full((3,), step, dtype=torch.bfloat16),
    }


def test_the_ring_of_buddies_over_nodes() -> None:
    # 3 nodes x 2 local ranks: node n's local rank l copies to node n+1's local rank l
    assert [replica.buddy_rank(r, 6, 2) for r in range(6)] == [2, 3, 4, 5, 0, 1]
    assert [replica.buddy_rank(r, 2, 1) for r in range(2)] == [1, 0]
    assert replica.buddy_rank(0, 4, 4) is None  # one node: no buddy to survive its loss


def test_each_completed_slot_reaches_the_buddy_two_files_per_rank() -> None:
    own, buddy = shm.create("job", "trainer.0"), shm.create("job", "trainer.1")
    sent: list[int] = []

    def keep(slot: int, data: bytes | None) -> None:
        assert data is not None  # nothing voided here
        sent.append(replica.store(buddy, slot, data).stat().st_size)

    rep = replica.Replicator(own, 0, keep, print)
    ckpt = FlashCheckpointer(own)
    for step in range(1, 6):
        ckpt.save(step, state(step))
        rep.tick()
        rep.tick()  # a slot already copied is not sent again
    assert rep.copies == 5 and len(sent) == 5
    kept = replica.held(buddy)
    assert sorted(kept) == ["replica-0-0", "replica-0-1"]  # the rank's two slots, mirrored
    assert sorted(h.step for h in kept.values()) == [4, 5]
    assert not [p for p in buddy.iterdir() if p.name.startswith(".")]  # no temporary left


def test_load_takes_the_replica_when_the_own_slots_are_gone() -> None:
    own = shm.create("job", "trainer.0")
    ckpt = FlashCheckpointer(own)

    def keep(slot: int, data: bytes | None) -> None:
        assert data is not None
        replica.store(own, slot, data)  # the holder is this very folder (a world of one)

    rep = replica.Replicator(own, 0, keep, print)
    for step in range(1, 4):
        ckpt.save(step, state(step))
        rep.tick()
    for slot in own.glob("slot-*"):
        slot.unlink()  # the agent's memory is gone; the replicas (as a holder keeps them) are left
    restored = FlashCheckpointer(own).load()
    assert restored is not None and (restored.step, restored.source) == (3, "replica")
    assert all(torch.equal(restored.state[k], state(3)[k]) for k in ("w", "h"))


def test_a_failing_buddy_is_an_event_once_then_retried_never_a_crash() -> None:
    own = shm.create("job", "trainer.0")
    events: list[str] = []
    broken = [True]

    def send(slot: int, data: bytes | None) -> None:
        if broken[0]:
            raise ConnectionError("the buddy agent is gone")

    rep = replica.Replicator(own, 0, send, lambda kind, message: events.append(kind), tick_s=0.01).start()
    FlashCheckpointer(own).save(1, state(1))
    deadline = time.monotonic() + 20
    while rep.failures < 3 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert rep.failures >= 3 and rep.copies == 0 and events == ["checkpoint_replica_failed"]
    broken[0] = False
    while rep.copies != 1 and time.monotonic() < deadline:
        time.sleep(0.01)
    rep.stop()
    assert rep.copies == 1 and events == ["checkpoint_replica_failed", "checkpoint_replicated"]


def test_soak_an_idle_replicator_sends_nothing() -> None:
    own = shm.create("job", "trainer.0")
    sent: list[int] = []
    rep = replica.Replicator(
        own, 0, lambda slot, data: sent.append(slot), lambda k, m: sent.append(-1), tick_s=0.005
    )
    rep.start()
    time.sleep(1.0)  # 200 ticks with nothing saved
    FlashCheckpointer(own).save(1, state(1))
    deadline = time.monotonic() + 20
    while rep.copies != 1 and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.5)  # 100 more ticks: the same slot is not sent again
    rep.stop()
    assert sent == [0] and rep.failures == 0


def test_the_plan_restores_the_newest_step_every_rank_can_get() -> None:
    # rank 1's agent is new (nothing of its own); rank 0 keeps rank 1's replica of step 5
    everyone: list[tuple[int, dict[int, tuple[int, int]], int | None, replica_load.Held]] = [
        (0, {5: (0, 2), 6: (0, 2)}, 6, {"replica-1-0": (1, 2, 5, 10, 100)}),
        (1, {}, None, {}),
    ]
    found = replica_load.plan(everyone, 2)
    assert found is not None and found[0] == 5
    assert found[1] == {1: replica_load.Source(1, 0, "replica-1-0", 10, 100)}
    # a replica of another world size, or none at all: nothing every rank can restore
    stale = [(0, {6: (0, 2)}, 6, {"replica-1-1": (1, 4, 6, 10, 100)}), (1, {}, None, {})]
    assert replica_load.plan(stale, 2) is None
    both = [(0, {6: (0, 2)}, 6, {}), (1, {6: (1, 2)}, 7, {})]
    assert replica_load.plan(both, 2) == (6, {})  # all in memory: no replica moves
