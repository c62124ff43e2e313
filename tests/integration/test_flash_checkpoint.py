"""Flash checkpoints in a real elastic job: training processes SIGKILLed between saves and in
the middle of one resume the newest step every rank committed, with the very tensors saved
(checksums), from the agents' shared memory; nothing is left in /dev/shm when the job ends."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from dlu_api.spec import spec_from_dict
from dlu_api.status import JobStatus

pytestmark = [pytest.mark.ray, pytest.mark.slow, pytest.mark.timeout(300)]

HERE = Path(__file__).parent
SHM = Path("/dev/shm")


def flash_job(name: str, env: dict[str, str], nnodes: int = 2, **elastic: Any) -> Any:
    return spec_from_dict(
        {
            "name": name,
            "device_type": "CPU",
            "device_per_node": 0,
            "node_num": nnodes,
            "health": {"monitor_interval_s": 0.2},
            "roles": [
                {
                    "name": "trainer",
                    "kind": "elastic",
                    "entrypoint": "flash_workloads:train",
                    "resources": {"cpu": 0.25},
                    "env": env,
                    "elastic": {
                        "nnodes": nnodes,
                        "nproc_per_node": 1,
                        "node_check": {"enabled": False},
                        **elastic,
                    },
                }
            ],
        }
    )


def run(spec: Any) -> JobStatus:
    from dlu_prime import launcher

    return launcher.run_job(spec, str(HERE))


def starts(out: Path, attempt: int) -> list[dict[str, Any]]:
    return [json.loads(p.read_text()) for p in sorted(out.glob(f"start-r*-a{attempt}.json"))]


def assert_resumed(out: Path, step: int, source: str, world: int = 2) -> None:
    """Every rank of the second attempt restored `step` from `source`, with the saved bytes."""
    second = starts(out, 1)
    assert len(second) == world, second
    for rank, record in enumerate(second):
        assert (record["step"], record["source"]) == (step, source), record
        assert record["checksum"] == (out / f"sum-r{rank}-s{step}.txt").read_text()


def leftovers(job: str, wait_s: float = 30.0) -> list[Path]:
    """The job's folders still in /dev/shm once their reapers had `wait_s` to remove them."""
    deadline = time.monotonic() + wait_s
    while True:
        found = [p for p in SHM.iterdir() if p.name.startswith("dlu-ckpt.") and f".{job}." in p.name]
        if not found or time.monotonic() > deadline:
            return found
        time.sleep(0.1)


def test_sigkill_between_saves_resumes_the_last_step_from_memory(ray_session: Any, tmp_path: Path) -> None:
    status = run(flash_job("flash-between", {"OUT_DIR": str(tmp_path), "KILL_AFTER_SAVE": "6:1"}))
    assert status.exit_code == 0, status.reason
    assert [e.kind for e in status.events].count("inplace_restart") == 1
    assert_resumed(tmp_path, 6, "memory")  # no step lost
    finals = {json.loads(p.read_text())["checksum"] for p in tmp_path.glob("done-r*.json")}
    assert len(finals) == 2 and not leftovers("flash-between")


def test_sigkill_mid_save_keeps_the_previous_committed_step(ray_session: Any, tmp_path: Path) -> None:
    env = {"OUT_DIR": str(tmp_path), "DLU_FAULT_CHECKPOINT_KILL_MID_SAVE": "5:0"}
    status = run(flash_job("flash-mid", env))
    assert status.exit_code == 0, status.reason
    assert [e.kind for e in status.events].count("inplace_restart") == 1
    assert_resumed(tmp_path, 4, "memory")  # the step being saved is the one lost
    assert not leftovers("flash-mid")


def test_fresh_run_finds_nothing_committed(ray_session: Any, tmp_path: Path) -> None:
    status = run(flash_job("flash-fresh", {"OUT_DIR": str(tmp_path), "STEPS": "2"}))
    assert status.exit_code == 0, status.reason
    assert [r["step"] for r in starts(tmp_path, 0)] == [0, 0]
    assert not leftovers("flash-fresh")
