"""The restore of a state one rank holds (a DDP job's rank 0) for every rank: one packed buffer
in one broadcast, unpacked bit for bit; a buffer shorter than its layout is refused. The last
test runs a real gloo world of three processes on localhost (no Ray)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from dlu_elastic.checkpoint import CheckpointError, FlashCheckpointer, api, shm
from dlu_elastic.checkpoint.broadcast import layout_of, pack, tell, unpack
from dlu_elastic.checkpoint.slot import SlotWriter, read_meta, read_with, slot_path

pytestmark = pytest.mark.timeout(120)

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE))
from flash_ranks import state, tensor_bytes  # noqa: E402


def test_pack_then_unpack_gives_the_same_bits_of_every_dtype() -> None:
    value = state(3)
    skeleton, entries, nbytes = layout_of(value)
    packed = pack(value, entries, nbytes)
    back = unpack(skeleton, entries, packed)
    assert tensor_bytes(back) == tensor_bytes(value)  # NaN, -0.0, bf16, bool, empty, not contiguous
    assert back["meta"] == value["meta"] and back["opt"]["param_groups"] == value["opt"]["param_groups"]


def test_unpacked_tensors_own_their_memory() -> None:
    value = state(1)
    skeleton, entries, nbytes = layout_of(value)
    packed = pack(value, entries, nbytes)
    back = unpack(skeleton, entries, packed)
    packed.fill_(0xFF)  # the buffer reused or dropped: the restored tensors are unchanged
    assert tensor_bytes(back) == tensor_bytes(value)


def test_a_buffer_shorter_than_its_layout_is_refused() -> None:
    value = state(2)
    skeleton, entries, nbytes = layout_of(value)
    partial = pack(value, entries, nbytes)[: nbytes // 2]
    with pytest.raises(CheckpointError, match=r"a packed state of \d+ bytes for a layout of \d+"):
        unpack(skeleton, entries, partial)
    with pytest.raises(CheckpointError, match=r"tensors to pack for a layout of"):
        pack({"only": torch.ones(1)}, entries, nbytes)


@pytest.fixture
def world_of_one(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "1")
    monkeypatch.setenv(shm.ROOT_ENV, str(tmp_path / "shm"))
    (tmp_path / "shm").mkdir()
    return shm.create("job", "job.trainer.0")


def test_load_tells_each_complete_slot_and_never_a_torn_one(world_of_one: Path) -> None:
    ckpt = FlashCheckpointer(world_of_one)
    ckpt.save(1, state(1))
    ckpt.save(2, state(2))
    slots = {step: slot_path(world_of_one, slot) for step, slot in ckpt.own_steps().items()}
    told = tell(slots, rank=0)
    assert sorted(told) == [1, 2]
    seq, empty, layout = told[2]
    assert seq % 2 == 0 and not empty and layout is not None  # an even seq: complete
    assert layout[1:] == layout_of(state(2))[1:]  # the entries and size the receivers unpack with
    assert all(t[2] is None for t in tell(slots, rank=1).values())  # only rank 0 sends its layout
    SlotWriter(slots[2]).begin(0, 1, 3)  # a save of step 3 under way in that slot: torn
    assert sorted(tell(slots, rank=0)) == [1]


def test_a_slot_rewritten_between_the_news_and_its_read_is_refused(
    world_of_one: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ckpt = FlashCheckpointer(world_of_one)
    ckpt.save(1, state(1))
    ckpt.save(2, state(2))

    def rewritten_first(path: Path, build: Any) -> Any:
        # another writer rewrites the slot (same step, a new seq) after load() told it
        read = read_meta(path)
        assert read is not None
        header, meta = read
        writer = SlotWriter(path)
        end = writer.begin(header.rank, header.world, header.step)
        writer.write_meta(meta)
        writer.finish(end, header.step, len(meta), header.payload_len, header.rank, header.world)
        writer.close()
        return read_with(path, build)

    monkeypatch.setattr(api, "read_with", rewritten_first)
    with pytest.raises(CheckpointError, match="was rewritten during load"):
        FlashCheckpointer(world_of_one).load()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_a_ddp_state_saved_by_rank_0_reaches_every_rank_bit_for_bit_in_one_broadcast_one_gather(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv(shm.ROOT_ENV, str(tmp_path / "shm"))
    (tmp_path / "shm").mkdir()
    world, port, load_port = 3, _free_port(), _free_port()
    procs = []
    for rank in range(world):
        env = {**os.environ, "RANK": str(rank), "WORLD_SIZE": str(world)}
        env |= {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "LOAD_PORT": str(load_port)}
        where = shm.create("job", f"job.trainer.{rank}")
        cmd = [sys.executable, str(HERE / "flash_ranks.py"), str(where), str(tmp_path / f"out-{rank}.json")]
        procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT))
    failed: list[Any] = []
    try:
        for rank, proc in enumerate(procs):
            out, _ = proc.communicate(timeout=100)
            if proc.returncode != 0:
                failed.append((rank, proc.returncode, out.decode()[-2000:]))
    finally:
        for proc in procs:  # one rank failed, the others wait for it in a collective
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    assert not failed, failed
    for rank in range(world):
        got = json.loads((tmp_path / f"out-{rank}.json").read_text())
        assert (got["step"], got["source"]) == (3, "memory"), rank
        assert got["state"] == got["expected"], f"rank {rank} restored other bytes"
        # the 40-odd tensors travel as one buffer (a broadcast per tensor: a round trip each),
        # and who saved None and rank 0's layout came with the news (no gather of their own)
        assert (got["broadcasts"], got["gathers"]) == (1, 1), (rank, got["broadcasts"], got["gathers"])
