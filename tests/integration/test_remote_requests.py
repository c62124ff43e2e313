"""Remote commands without a Ray job per call, workdir upload and `dlu run --no-wait`, from a
driver with only the dlu-api wheel against a real Ray head (conftest `ray_cluster`).

`dlu status`, `events` and `debug` of a running job read what its launcher publishes in its
log, or leave a request in its mailbox; Ray's job list is compared before and after, so a probe
job would be seen. `dlu stop` goes through the mailbox, then `dlu list` and `dlu status` must
give the same exit code. `--workdir DIR` uploads a directory the cluster does not have.
"""

from __future__ import annotations

import json
import statistics
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from test_remote_cluster import CPU_JOB, ISOLATION, dlu, status_json, write_spec
from wheel_envs import RayCluster, Venv

from dlu_api.client.remote import RemoteJobClient

pytestmark = [pytest.mark.ray, pytest.mark.slow, pytest.mark.timeout(600)]

HOLD: dict[str, Any] = {
    **CPU_JOB,
    "master": ISOLATION,
    "config": {"steps": 100_000, "step_seconds": 0.1},
    "health": {"monitor_interval_s": 0.2},
    "roles": [{"name": "worker", "entrypoint": "examples.hello.workers:main", "total": 2,
               "resources": {"cpu": 0.1}}],
}  # fmt: skip


def ray_job_ids(cluster: RayCluster) -> set[str]:
    jobs = httpx.get(f"{cluster.address}/api/jobs/", timeout=30).json()
    return {str(j["submission_id"]) for j in jobs}


def wait_stage(
    driver: Venv, job: str, cluster: RayCluster, stage: str, timeout_s: float = 120
) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    while (current := status_json(driver, job, cluster))["stage"] != stage:
        assert time.monotonic() < deadline, current
        time.sleep(0.5)
    return current


def test_status_events_debug_add_no_ray_job_and_stop_goes_through_the_mailbox(
    driver_venv: Venv, ray_cluster: RayCluster, tmp_path: Path
) -> None:
    address = ("--address", ray_cluster.address)
    done = dlu(
        driver_venv, "submit", str(write_spec(tmp_path, {**HOLD, "name": "quick"})), *address, cwd=tmp_path
    )
    assert done.returncode == 0, done.stdout + done.stderr
    try:
        wait_stage(driver_venv, "quick", ray_cluster, "RUNNING")
        before = ray_job_ids(ray_cluster)

        took: list[float] = []
        for _ in range(7):  # the whole command, as a user runs it: interpreter start included
            began = time.monotonic()
            current = status_json(driver_venv, "quick", ray_cluster)
            took.append(time.monotonic() - began)
        assert current["stage"] == "RUNNING"
        assert [a["stage"] for a in current["roles"][0]["actors"]] == ["RUNNING", "RUNNING"]
        client = RemoteJobClient(ray_cluster.address)
        in_process: list[float] = []
        for _ in range(7):
            began = time.monotonic()
            client.status("quick")
            in_process.append(time.monotonic() - began)
        client.close()
        print(
            f"dlu status of a running remote job: median {statistics.median(took):.3f} s per command "
            f"({', '.join(f'{t:.2f}' for t in took)}); RemoteJobClient.status median "
            f"{statistics.median(in_process) * 1000:.1f} ms"
        )

        events = dlu(driver_venv, "events", "quick", *address, cwd=tmp_path)
        assert events.returncode == 0, events.stderr
        kinds = [json.loads(line)["kind"] for line in events.stdout.splitlines()]
        assert kinds[:1] == ["job_created"], kinds

        step = dlu(driver_venv, "debug", "quick", "get-step", "worker", *address, cwd=tmp_path)
        assert step.returncode == 0, step.stdout + step.stderr
        assert "quick.worker.0\t" in step.stdout and "quick.worker.1\t" in step.stdout, step.stdout
        refused = dlu(driver_venv, "debug", "quick", "get-step", "nope", *address, cwd=tmp_path)
        assert refused.returncode == 2 and "nope" in refused.stderr, refused.stderr

        assert ray_job_ids(ray_cluster) == before  # no probe job, nothing left behind

        stopped = dlu(driver_venv, "stop", "quick", *address, cwd=tmp_path)
        assert stopped.returncode == 0, stopped.stderr
        final = wait_stage(driver_venv, "quick", ray_cluster, "STOPPED", 90)
        assert "stopped by user request" in final["reason"]
        assert ray_job_ids(ray_cluster) == before
    finally:
        dlu(driver_venv, "stop", "quick", *address, cwd=tmp_path)
    listed = {
        j["name"]: j for j in json.loads(dlu(driver_venv, "list", "--json", *address, cwd=tmp_path).stdout)
    }
    assert (listed["quick"]["stage"], listed["quick"]["exit_code"]) == ("STOPPED", final["exit_code"])
    assert final["exit_code"] == 130


def test_workdir_is_uploaded_from_a_dlu_api_only_driver(
    driver_venv: Venv, ray_cluster: RayCluster, tmp_path: Path
) -> None:
    """The job's code exists only on the driver: `--workdir DIR` uploads it (the cluster's own
    working directory holds examples/ only); .git and __pycache__ stay behind."""
    code = tmp_path / "code"
    (code / "mycode").mkdir(parents=True)
    (code / "mycode" / "__init__.py").write_text("")
    (code / "mycode" / "job.py").write_text(
        "from dlu_prime.runtime import current_worker, heartbeat\n\n"
        "def main() -> None:\n"
        "    worker = current_worker()\n"
        "    heartbeat(1)\n"
        "    print(f'uploaded code ran as rank {worker.rank}', flush=True)\n"
    )
    (code / ".git").mkdir()
    (code / ".git" / "pack").write_bytes(b"\0" * (3 * 2**20))  # left out: over the limit set below
    (code / "mycode" / "__pycache__").mkdir()
    (code / "mycode" / "__pycache__" / "junk.pyc").write_bytes(b"\0" * (3 * 2**20))
    assert not (ray_cluster.workdir / "mycode").exists()
    spec = {**CPU_JOB, "name": "uploaded", "master": ISOLATION,
            "roles": [{"name": "w", "entrypoint": "mycode.job:main", "total": 2, "resources": {"cpu": 0.1}}]}  # fmt: skip
    path = write_spec(tmp_path, spec)
    env_limit = {"DLU_UPLOAD_LIMIT_MB": "1"}
    address = ("--address", ray_cluster.address)
    before = ray_job_ids(ray_cluster)

    too_big = code / "data.bin"
    too_big.write_bytes(b"\1" * (2 * 2**20))
    refused = dlu(
        driver_venv, "run", str(path), *address, "--workdir", str(code), cwd=tmp_path, env=env_limit
    )
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert "upload limit of 1 MiB" in refused.stderr and "DLU_UPLOAD_LIMIT_MB" in refused.stderr
    assert ray_job_ids(ray_cluster) == before  # refused before anything was sent
    too_big.unlink()

    done = dlu(driver_venv, "run", str(path), *address, "--workdir", str(code), cwd=tmp_path, env=env_limit)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "job uploaded: STOPPED (exit code 0)" in done.stdout
    listed = httpx.get(f"{ray_cluster.address}/api/jobs/", timeout=30).json()
    (run,) = [j for j in listed if (j.get("metadata") or {}).get("dlu_job") == "uploaded"]
    assert str(run["runtime_env"]["working_dir"]).startswith("gcs://_ray_pkg_")

    # `dlu submit` uploads the same way; the same content is found on the cluster, not sent again
    again = dlu(
        driver_venv, "submit", str(path), *address, "--workdir", str(code), cwd=tmp_path, env=env_limit
    )
    assert again.returncode == 0, again.stdout + again.stderr
    follow = dlu(driver_venv, "events", "-f", "uploaded", *address, cwd=tmp_path)
    assert "job uploaded: STOPPED (exit code 0)" in follow.stdout, follow.stdout + follow.stderr
    runs = [j for j in httpx.get(f"{ray_cluster.address}/api/jobs/", timeout=30).json()
            if (j.get("metadata") or {}).get("dlu_job") == "uploaded"]  # fmt: skip
    assert len(runs) == 2 and len({r["runtime_env"]["working_dir"] for r in runs}) == 1


def test_run_no_wait_returns_once_running(driver_venv: Venv, ray_cluster: RayCluster, tmp_path: Path) -> None:
    address = ("--address", ray_cluster.address)
    path = write_spec(tmp_path, {**HOLD, "name": "detached"})
    try:
        done = dlu(driver_venv, "run", "--no-wait", str(path), *address, cwd=tmp_path)
        assert done.returncode == 0, done.stdout + done.stderr
        assert "job detached is RUNNING" in done.stdout
        assert f"dlu stop detached --address {ray_cluster.address}" in done.stdout
        assert status_json(driver_venv, "detached", ray_cluster)["stage"] == "RUNNING"
    finally:
        dlu(driver_venv, "stop", "detached", *address, cwd=tmp_path)
    wait_stage(driver_venv, "detached", ray_cluster, "STOPPED", 90)
