"""Flash checkpoint replicas on a buddy node's agent: a rank whose agent is SIGKILLed, its
shared memory removed first (as when its node is lost; else its replacement adopts it), resumes the committed step from the copy
its buddy agent keeps, with the very tensors saved (checksums); two replica files per buddied
rank (its slots, mirrored); nothing left in /dev/shm when the job ends."""

from __future__ import annotations

import os
import shutil
import signal
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from test_flash_checkpoint import SHM, flash_job, leftovers, run, starts

from dlu_api.status import JobStatus

pytestmark = [pytest.mark.ray, pytest.mark.slow, pytest.mark.timeout(300)]


def replicas_of(job: str) -> list[Path]:
    return sorted(SHM.glob(f"dlu-ckpt.*.{job}.*/replica-*"))


def kill_agent(name: str, out: Path, **checkpoint: Any) -> tuple[JobStatus, list[str]]:
    """Run the job; once rank 1 saved step 8 and each rank's buddy keeps its slots, remove rank
    1's shared-memory folder and SIGKILL its agent and training process. Returns the status and
    the replica files seen just before the kill."""
    import ray

    from dlu_prime.naming import NAMESPACE

    env = {"OUT_DIR": str(out), "STEPS": "40", "STEP_SLEEP_S": "0.2"}
    spec = flash_job(name, env, checkpoint=checkpoint)
    with ThreadPoolExecutor(1) as pool:
        job = pool.submit(run, spec)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not job.done():
            if (out / "saved-r1-s8").exists() and len(replicas_of(name)) == 4:  # both buddies up
                break
            time.sleep(0.05)
        assert (out / "saved-r1-s8").exists()
        seen = [p.name for p in replicas_of(name)]
        agent = ray.get_actor(f"{name}.trainer.1", namespace=NAMESPACE)
        status = dict(ray.get(agent.status.remote(), timeout=30))
        trainer = int(status["process_pid"])
        for folder in SHM.glob(f"dlu-ckpt.*.{name}.{name}.trainer.1"):
            shutil.rmtree(folder)  # its memory is lost with it
        ray.kill(agent, no_restart=True)
        os.kill(trainer, signal.SIGKILL)
        return job.result(timeout=240), seen


def test_agent_killed_resumes_the_committed_step_from_its_buddys_replica(
    ray_session: Any, tmp_path: Path
) -> None:
    durable = tmp_path / "durable"
    status, seen = kill_agent("flash-replica", tmp_path, persist_every=1000, dir=str(durable), replicas=1)
    assert status.exit_code == 0, status.reason
    assert sorted(seen) == ["replica-0-0", "replica-0-1", "replica-1-0", "replica-1-1"], seen  # 2 per rank
    second = [starts(tmp_path, rank)[1] for rank in (0, 1)]
    assert [s["source"] for s in second] == ["memory", "replica"], second
    step = second[0]["step"]
    assert second[1]["step"] == step and step >= 6, second  # nothing on disk: persist_every 1000
    for rank, record in enumerate(second):
        assert record["checksum"] == (tmp_path / f"sum-r{rank}-s{step}.txt").read_text()
    restored = [e.message for e in status.events if e.kind == "checkpoint_restored"]
    assert len(restored) == 1 and restored[0].startswith(f"resumed step {step} from replica"), restored
    failed = [e.message for e in status.events if e.kind == "checkpoint_replica_failed"]
    assert all(m.startswith("rank 0:") for m in failed), failed  # only the rank whose buddy died
    assert not leftovers("flash-replica")
