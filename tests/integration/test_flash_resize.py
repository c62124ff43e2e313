"""Flash checkpoints across a resize (`dlu scale` of the elastic role, 2 -> 1 -> 2 ranks): a
DDP state (rank 0 saves it, the others None) resumes the old world's newest committed step
from memory in the new world, every rank with the very tensors rank 0 saved (checksums); a
sharded state (each rank its shard) is not resharded, and the restore event says so. Nothing
is left in /dev/shm when the job ends."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from test_flash_checkpoint import flash_job, leftovers, run, starts

from dlu_api.status import JobStatus

pytestmark = [pytest.mark.ray, pytest.mark.slow, pytest.mark.timeout(400)]


def wait_for(what: str, check: Any, timeout: float = 150.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)


def resized_job(name: str, out: Path, sizes: list[int], **env: str) -> JobStatus:
    """Run the flash workload at 2 ranks (nnodes 1:2); after a few steps at each size, `dlu
    scale` it to the next of `sizes`; then finish. Returns the final status."""
    from dlu_prime import launcher

    spec = flash_job(
        name, {"OUT_DIR": str(out), "STEPS": "100000", "STEP_SLEEP_S": "0.1", **env}, sizes="1:2"
    )
    with ThreadPoolExecutor(1) as pool:
        job = pool.submit(run, spec)
        wait_for("step 5", lambda: (out / "sum-r0-s5.txt").exists() or job.done())
        for index, size in enumerate(sizes, start=2):
            launcher.scale_job(name, "trainer", size)
            wait_for(f"rank 0's start {index}", lambda i=index: len(starts(out, 0)) >= i or job.done())
            at = starts(out, 0)[-1]["step"]
            wait_for(
                f"3 steps at size {size}",
                lambda at=at: (out / f"sum-r0-s{at + 3}.txt").exists() or job.done(),
            )
        (out / "finish").write_text("")
        return job.result(timeout=120)


def test_a_ddp_state_resumes_from_memory_across_a_resize(ray_session: Any, tmp_path: Path) -> None:
    status = resized_job("flash-resize-ddp", tmp_path, [1, 2], SHARED="1")
    assert status.exit_code == 0, status.reason
    first, down, up = starts(tmp_path, 0)[:3]
    assert first["source"] is None and (down["world"], up["world"]) == (1, 2), (down, up)
    grown = starts(tmp_path, 1)[-1]  # rank 1 of the grown world: a new agent, rank 0's state
    assert (down["source"], up["source"], grown["source"]) == ("memory",) * 3, (down, up, grown)
    assert grown["step"] == up["step"]
    for record in (down, up, grown):  # rank 0's state of that step, on every rank
        assert record["checksum"] == (tmp_path / f"sum-r0-s{record['step']}.txt").read_text()
    restored = [e.message for e in status.events if e.kind == "checkpoint_restored"]
    said = "from memory (resized from {} to {} ranks: old rank 0's state for every rank); steps lost: "
    assert any(f"resumed step {down['step']} " + said.format(2, 1) in m for m in restored), restored
    assert any(f"resumed step {up['step']} " + said.format(1, 2) in m for m in restored), restored
    assert f"resumed step {up['step']} {said.format(1, 2)}0" in restored  # all of world 1 was there
    assert not leftovers("flash-resize-ddp")


def test_a_sharded_state_is_not_resharded_and_the_event_says_so(ray_session: Any, tmp_path: Path) -> None:
    status = resized_job("flash-resize-sharded", tmp_path, [1])
    assert status.exit_code == 0, status.reason
    down = starts(tmp_path, 0)[1]
    assert down["source"] is None and down["step"] == 0, down  # load(missing_ok=True): None
    restored = [e.message for e in status.events if e.kind == "checkpoint_restored"]
    said = "resumed step 0 from nothing (step {} was saved sharded over 2 ranks and the world has 1"
    assert any(
        m.startswith(said.format("")[:30]) and "is not resharded; none on disk" in m for m in restored
    ), restored
    assert not leftovers("flash-resize-sharded")
