"""dlu_elastic.checkpoint in one process (world of 1, no Ray): slots, refusals, crash in the
middle of a save (a real SIGKILL of a child process), stale folders, the reaper, and the
persister's writes, retries and idle soak."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections import namedtuple
from pathlib import Path
from typing import Any

import pytest
import torch

from dlu_elastic.checkpoint import (
    CheckpointError,
    FlashCheckpointer,
    LayoutChanged,
    NoCheckpoint,
    ShmFull,
    disk,
    shm,
)
from dlu_elastic.checkpoint.persist import Persister
from dlu_elastic.checkpoint.slot import headers

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(autouse=True)
def _world_of_one(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "1")
    monkeypatch.setenv(shm.ROOT_ENV, str(tmp_path / "shm"))
    (tmp_path / "shm").mkdir()


def state(step: int) -> dict[str, Any]:
    return {
        "model": {
            "w": torch.arange(12, dtype=torch.float32).reshape(3, 4) * step,
            "t": torch.arange(6, dtype=torch.float64).reshape(2, 3).t(),  # not contiguous
        },
        "half": torch.full((5,), float(step), dtype=torch.bfloat16),
        "ids": torch.tensor([step, -step], dtype=torch.int64),
        "mask": torch.tensor([True, step % 2 == 0]),
        "empty": torch.empty(0, 3),
        "scalar": torch.tensor(float(step)),
        "meta": {"step": step, "lr": 0.1, "names": ["a", "b"], "pair": (1, 2)},
    }


def same(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple):
        return type(a) is type(b) and len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b)


def folder() -> Path:
    return shm.create("job", "trainer.0")


def test_round_trip_of_every_dtype_and_metadata_from_a_new_process_view() -> None:
    where = folder()
    ckpt = FlashCheckpointer(where)
    for step in (1, 2, 3):
        ckpt.save(step, state(step))
    restored = FlashCheckpointer(where).load()
    assert restored is not None
    assert (restored.step, restored.source) == (3, "memory")
    assert same(restored.state, state(3))
    assert sorted(h.step for h in headers(where) if h) == [2, 3]  # two slots: committed, in flight


def test_the_restored_state_is_a_copy_not_a_view_of_the_slot() -> None:
    where = folder()
    FlashCheckpointer(where).save(1, state(1))
    ckpt = FlashCheckpointer(where)
    first = ckpt.load()
    assert first is not None
    ckpt.save(2, state(2))
    ckpt.save(3, state(3))
    assert same(first.state, state(1))


def test_nothing_committed_is_a_clear_error_or_none() -> None:
    ckpt = FlashCheckpointer(folder())
    with pytest.raises(NoCheckpoint, match=r"no step is committed by all 1 ranks.*missing_ok=True"):
        ckpt.load()
    assert ckpt.load(missing_ok=True) is None


def test_a_shape_change_between_saves_is_refused_naming_the_tensor() -> None:
    ckpt = FlashCheckpointer(folder())
    ckpt.save(1, {"w": torch.zeros(4, 4)})
    with pytest.raises(
        LayoutChanged, match=r"'w' is torch.float32 \[8, 4\], it was 'w' torch.float32 \[4, 4\]"
    ):
        ckpt.save(2, {"w": torch.zeros(8, 4)})
    with pytest.raises(LayoutChanged, match="2 tensors, the previous save had 1"):
        ckpt.save(2, {"w": torch.zeros(4, 4), "b": torch.zeros(1)})
    restored = FlashCheckpointer(ckpt.folder).load()
    assert restored is not None and restored.step == 1


def test_a_state_over_shm_free_space_is_refused_with_both_sizes(monkeypatch: pytest.MonkeyPatch) -> None:
    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr("shutil.disk_usage", lambda _: usage(10 << 20, 9 << 20, 1 << 20))
    ckpt = FlashCheckpointer(folder())
    with pytest.raises(ShmFull, match=r"needs 9\.0 MiB per slot .* has 1\.0 MiB free"):
        ckpt.save(1, {"w": torch.zeros(2 << 20)})  # 8 MiB of payload


def test_outside_dlu_the_folder_is_asked_for(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(shm.FOLDER_ENV, raising=False)
    with pytest.raises(CheckpointError, match=shm.FOLDER_ENV):
        FlashCheckpointer()


def test_a_process_that_saves_without_loading_starts_afresh() -> None:
    where = folder()
    old = FlashCheckpointer(where)
    old.save(9, state(9))
    old.save(10, state(10))
    new = FlashCheckpointer(where)
    new.save(1, state(1))
    restored = FlashCheckpointer(where).load()
    assert restored is not None and restored.step == 1


CHILD = """
import os, sys, torch
from dlu_elastic.checkpoint import FlashCheckpointer
ckpt = FlashCheckpointer(__import__("pathlib").Path(sys.argv[1]))
for step in (1, 2, 3):
    ckpt.save(step, {"a": torch.full((1000,), float(step)), "b": torch.full((1000,), -float(step))})
"""


def test_a_process_sigkilled_mid_save_leaves_the_previous_step_whole(tmp_path: Path) -> None:
    where = folder()
    env = {**os.environ, "DLU_FAULT_CHECKPOINT_KILL_MID_SAVE": "3:0", "TORCHELASTIC_RESTART_COUNT": "0"}
    child = subprocess.run(
        [sys.executable, "-c", CHILD, str(where)], env=env, capture_output=True, timeout=50
    )
    assert child.returncode == -9, child.stderr.decode()[-2000:]
    assert [h.complete for h in headers(where) if h].count(False) == 1  # the torn slot
    restored = FlashCheckpointer(where).load()
    assert restored is not None and restored.step == 2
    assert same(restored.state, {"a": torch.full((1000,), 2.0), "b": torch.full((1000,), -2.0)})


def test_stale_folders_of_dead_agents_are_swept_live_ones_kept(tmp_path: Path) -> None:
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    )
    gone = shm.root() / f"{shm.PREFIX}{int(dead.stdout)}.job.trainer.1"
    gone.mkdir()
    (gone / "slot-0").write_bytes(b"x" * 100)
    live = shm.root() / f"{shm.PREFIX}{os.getppid()}.job.trainer.2"
    live.mkdir()
    mine = folder()  # creating a folder sweeps
    assert not gone.exists() and live.exists() and mine.exists()


def test_the_reaper_removes_the_folder_when_its_agent_ends() -> None:
    agent = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time; from dlu_elastic.checkpoint import shm; "
            "f = shm.create('job', 'r'); shm.start_reaper(f); print(f, flush=True); time.sleep(60)",
        ],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, shm.ADOPT_GRACE_ENV: "2"},  # the adoption grace, short here
    )
    assert agent.stdout is not None
    where = Path(agent.stdout.readline().strip())
    assert where.is_dir()
    agent.kill()  # SIGKILL: no clean-up code of the agent runs
    agent.wait()
    deadline = time.monotonic() + 45
    while where.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not where.exists()


def test_persister_writes_every_kth_step_and_load_falls_back_to_disk(tmp_path: Path) -> None:
    where = folder()
    events: list[tuple[str, str]] = []
    persister = Persister(where, tmp_path / "durable", every=2, on_event=lambda k, m: events.append((k, m)))
    ckpt = FlashCheckpointer(where, persist_dir=str(tmp_path / "durable"))
    for step in range(1, 6):
        ckpt.save(step, state(step))
        persister.tick()
    assert sorted(disk.complete_steps(tmp_path / "durable")) == [4]  # older ones pruned
    assert events == []
    shm.remove(where)  # the agent is gone with its memory
    where.mkdir()
    restored = FlashCheckpointer(where, persist_dir=str(tmp_path / "durable")).load()
    assert restored is not None and (restored.step, restored.source) == (4, "disk")
    assert same(restored.state, state(4))


def test_a_failing_disk_is_an_event_and_a_retry_never_a_crash(tmp_path: Path) -> None:
    where = folder()
    blocker = tmp_path / "blocker"
    blocker.write_text("a file where the folder should be")  # mkdir under it: ENOTDIR
    events: list[str] = []
    persister = Persister(
        where, blocker / "durable", every=1, on_event=lambda k, m: events.append(k), tick_s=0.01
    )
    persister.start()
    ckpt = FlashCheckpointer(where)
    ckpt.save(1, state(1))
    deadline = time.monotonic() + 20
    while persister.failures < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert persister.failures >= 2 and events == ["checkpoint_persist_failed"]  # once per run of failures
    blocker.unlink()
    while persister.last_written != 1 and time.monotonic() < deadline:
        time.sleep(0.01)
    persister.stop()
    assert persister.last_written == 1 and events == ["checkpoint_persist_failed", "checkpoint_persisted"]
    assert sorted(disk.complete_steps(blocker / "durable")) == [1]


def test_soak_an_idle_persister_writes_nothing(tmp_path: Path) -> None:
    where = folder()
    events: list[str] = []
    persister = Persister(
        where, tmp_path / "d", every=1, on_event=lambda k, m: events.append(k), tick_s=0.005
    )
    persister.start()
    time.sleep(1.0)  # 200 ticks with nothing saved
    FlashCheckpointer(where).save(1, state(1))
    deadline = time.monotonic() + 20
    while persister.last_written != 1 and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.5)  # 100 more ticks: the same step is not written again
    persister.stop()
    assert persister.last_written == 1 and persister.failures == 0 and events == []
    assert sorted(disk.complete_steps(tmp_path / "d")) == [1]
