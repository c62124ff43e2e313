"""Flash checkpoints in a real elastic job: training processes SIGKILLed between saves and in
the middle of one resume the newest step every rank committed, with the very tensors saved
(checksums), from the agents' shared memory; nothing is left in /dev/shm when the job ends."""

from __future__ import annotations

import json
import os
import shutil
import signal
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from dlu_api.spec import spec_from_dict
from dlu_api.status import JobStatus

pytestmark = [pytest.mark.ray, pytest.mark.slow, pytest.mark.timeout(300)]

HERE = Path(__file__).parent
SHM = Path("/dev/shm")


def flash_job(
    name: str, env: dict[str, str], nnodes: int = 2, sizes: str | None = None, **elastic: Any
) -> Any:
    """The flash workload's job; `sizes` ("1:2"): the elastic role's nnodes range (a resize)."""
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
                        "nnodes": sizes or nnodes,
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


def starts(out: Path, rank: int) -> list[dict[str, Any]]:
    """What load() gave each process start of `rank`, in order."""
    return [json.loads(line) for line in (out / f"starts-r{rank}.jsonl").read_text().splitlines()]


def assert_resumed(out: Path, step: int | None, source: str | None, world: int = 2) -> int:
    """Every rank's second start restored `step` (None: any) from `source`, with the bytes saved
    at that step (checksums); returns the step."""
    seconds = [starts(out, rank) for rank in range(world)]
    assert all(len(s) == 2 for s in seconds), seconds
    resumed = {s[1]["step"] for s in seconds}
    assert len(resumed) == 1, seconds  # every rank resumes the same step
    for rank, (_, record) in enumerate(seconds):
        assert record["source"] == source and (step is None or record["step"] == step), record
        if source is not None:
            assert record["checksum"] == (out / f"sum-r{rank}-s{record['step']}.txt").read_text()
    return resumed.pop()


def leftovers(job: str, wait_s: float = 30.0) -> list[Path]:
    """The job's folders still in /dev/shm `wait_s` after the job ended: its end stops every
    agent (the finished ones too) before the clean-up kills them, and a stopped agent removes
    its folder at once; a killed one's would wait `ADOPT_GRACE_S` for an adopter, past this."""
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
    restored = [e.message for e in status.events if e.kind == "checkpoint_restored"]
    assert restored == ["resumed step 6 from memory; steps lost: 0"], restored
    finals = {json.loads(p.read_text())["checksum"] for p in tmp_path.glob("done-r*.json")}
    assert len(finals) == 2 and not leftovers("flash-between")


def test_sigkill_mid_save_keeps_the_previous_committed_step(ray_session: Any, tmp_path: Path) -> None:
    env = {"OUT_DIR": str(tmp_path), "DLU_FAULT_CHECKPOINT_KILL_MID_SAVE": "5:0"}
    status = run(flash_job("flash-mid", env))
    assert status.exit_code == 0, status.reason
    assert [e.kind for e in status.events].count("inplace_restart") == 1
    assert_resumed(tmp_path, 4, "memory")  # the step being saved is the one lost
    restored = [e.message for e in status.events if e.kind == "checkpoint_restored"]
    assert restored == ["resumed step 4 from memory; steps lost: 1"], restored
    assert not leftovers("flash-mid")


def test_fresh_run_finds_nothing_committed(ray_session: Any, tmp_path: Path) -> None:
    status = run(flash_job("flash-fresh", {"OUT_DIR": str(tmp_path), "STEPS": "2"}))
    assert status.exit_code == 0, status.reason
    assert [starts(tmp_path, r) for r in (0, 1)] == [
        [{"attempt": 0, "step": 0, "source": None, "checksum": None}]
    ] * 2
    assert not leftovers("flash-fresh")


def kill_agent_mid_run(
    name: str, out: Path, env: dict[str, str], memory_lost: bool = False, **elastic: Any
) -> JobStatus:
    """Run the job; once rank 1 saved step 8, SIGKILL its agent (the ElasticWorker actor) and
    its training process: a role restart, whose new agent adopts the dead one's folder on the
    same host. `memory_lost`: that folder is removed first (the host's shared memory lost)."""
    import ray

    from dlu_prime.naming import NAMESPACE

    spec = flash_job(name, {"OUT_DIR": str(out), "STEPS": "40", "STEP_SLEEP_S": "0.2", **env}, **elastic)
    with ThreadPoolExecutor(1) as pool:
        job = pool.submit(run, spec)
        deadline = time.monotonic() + 120
        while not (out / "saved-r1-s8").exists() and time.monotonic() < deadline and not job.done():
            time.sleep(0.05)
        assert (out / "saved-r1-s8").exists()
        agent = ray.get_actor(f"{name}.trainer.1", namespace=NAMESPACE)
        status = dict(ray.get(agent.status.remote(), timeout=30))
        trainer = int(status["process_pid"])
        if memory_lost:
            for folder in SHM.glob(f"dlu-ckpt.*.{name}.{name}.trainer.1"):
                shutil.rmtree(folder)
        ray.kill(agent, no_restart=True)
        os.kill(trainer, signal.SIGKILL)
        return job.result(timeout=240)


@pytest.fixture(scope="module")
def agents_killed(
    ray_session: Any, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, tuple[Future[JobStatus], Path]]:
    """The three agent-kill jobs, side by side (each its own job, named apart, its kill aimed at
    its own agent and its own /dev/shm folder): a job's time is mostly its paced steps and its
    role restart, which the others fill. Each test takes its job's outcome (what it raised too)."""
    outs = {key: tmp_path_factory.mktemp(f"agent-{key}") for key in ("disk", "none", "adopt")}
    persisted = {"checkpoint": {"persist_every": 2, "dir": str(outs["disk"] / "durable")}}
    with ThreadPoolExecutor(3) as pool:
        return {
            "disk": (
                pool.submit(kill_agent_mid_run, "flash-agent-disk", outs["disk"], {}, True, **persisted),
                outs["disk"],
            ),
            "none": (
                pool.submit(kill_agent_mid_run, "flash-agent-none", outs["none"], {}, True),
                outs["none"],
            ),
            "adopt": (pool.submit(kill_agent_mid_run, "flash-agent-adopt", outs["adopt"], {}), outs["adopt"]),
        }


def test_agent_killed_with_its_memory_resumes_from_the_persisted_step(
    agents_killed: dict[str, tuple[Future[JobStatus], Path]],
) -> None:
    job, tmp_path = agents_killed["disk"]
    status = job.result()
    assert status.exit_code == 0, status.reason
    step = assert_resumed(tmp_path, None, "disk")  # the agent's memory went with it
    assert step >= 2 and step % 2 == 0
    restored = [e.message for e in status.events if e.kind == "checkpoint_restored"]
    assert restored == [
        f"resumed step {step} from disk (rank 1 had no step in memory or in a buddy's replica); "
        f"steps lost: {restored[0].rsplit(' ', 1)[-1]}"
    ], restored
    assert not leftovers("flash-agent-disk")


def test_agent_killed_with_its_memory_and_no_persistence_starts_afresh_and_says_so(
    agents_killed: dict[str, tuple[Future[JobStatus], Path]],
) -> None:
    job, tmp_path = agents_killed["none"]
    status = job.result()
    assert status.exit_code == 0, status.reason
    assert_resumed(tmp_path, 0, None)  # load(missing_ok=True) said: nothing committed anywhere
    restored = [e.message for e in status.events if e.kind == "checkpoint_restored"]
    assert len(restored) == 1 and restored[0].startswith(
        "resumed step 0 from nothing (rank 1 had no step in memory or in a buddy's replica; none on disk)"
    ), restored
    assert not leftovers("flash-agent-none")


def test_role_restart_adopts_the_dead_agents_slots_and_resumes_from_memory(
    agents_killed: dict[str, tuple[Future[JobStatus], Path]],
) -> None:
    job, tmp_path = agents_killed["adopt"]
    status = job.result()
    assert status.exit_code == 0, status.reason
    step = assert_resumed(tmp_path, None, "memory")  # the new agent took over the dead one's folder
    assert step >= 8, step  # rank 1 had saved step 8 when its agent was killed
    restored = [e.message for e in status.events if e.kind == "checkpoint_restored"]
    said = f"resumed step {step} from memory (rank 1: slots adopted from the agent it replaced); steps lost: "
    assert len(restored) == 1 and restored[0].startswith(said), restored
    assert int(restored[0].removeprefix(said)) <= 1, restored  # at most the save under way when killed
    assert not leftovers("flash-agent-adopt")


def test_a_persist_folder_that_cannot_be_written_is_an_event_never_a_crash(
    ray_session: Any, tmp_path: Path
) -> None:
    blocker = tmp_path / "blocker"
    blocker.write_text("a file where the checkpoint folder should be")  # every mkdir under it: ENOTDIR
    env = {"OUT_DIR": str(tmp_path), "STEPS": "8", "STEP_SLEEP_S": "0.3"}
    status = run(
        flash_job("flash-disk-fail", env, checkpoint={"persist_every": 2, "dir": str(blocker / "ck")})
    )
    assert status.exit_code == 0, status.reason  # training never waited for the disk
    failed = sorted(e.message.split(":")[0] for e in status.events if e.kind == "checkpoint_persist_failed")
    assert failed == ["rank 0", "rank 1"], failed  # once per rank's run of failures, on that rank
    assert not leftovers("flash-disk-fail")
