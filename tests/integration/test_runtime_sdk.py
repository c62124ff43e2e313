"""The runtime SDK and every entrypoint form, inside real jobs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from dlu_api.spec import spec_from_dict
from dlu_api.status import JobStatus

pytestmark = [pytest.mark.ray, pytest.mark.timeout(150)]

WORKDIR = str(Path(__file__).parent)


def run(name: str, roles: list[dict[str, Any]], **job: Any) -> JobStatus:
    from dlu_prime import launcher

    spec = spec_from_dict(
        {
            "name": name,
            "device_type": "CPU",
            "device_per_node": 0,
            "health": {"monitor_interval_s": 0.2},
            "roles": [{"resources": {"cpu": 0.1}, **r} for r in roles],
            **job,
        }
    )
    return launcher.run_job(spec, WORKDIR)


def test_every_entrypoint_form(ray_session: Any) -> None:
    status = run(
        "sdk-forms",
        [
            {"name": "dotted", "entrypoint": "workloads.quick"},
            {"name": "script", "entrypoint": "script_job.py --lr 1e-3 'two words'", "total": 2},
            {"name": "looper", "entrypoint": "workloads:Looper", "total": 2},
            {"name": "caller", "entrypoint": "workloads:call_loopers"},
        ],
    )
    assert status.exit_code == 0, status.reason


def test_report_error_fails_the_job_with_the_message(ray_session: Any) -> None:
    status = run("sdk-report", [{"name": "w", "entrypoint": "workloads:report_and_wait"}])
    assert status.exit_code == 1
    assert "disk quota exceeded on the test worker" in status.reason
    assert any(e.kind == "error_report" for e in status.events)


def test_dynamic_sharding_processes_every_record_once(ray_session: Any, tmp_path: Path) -> None:
    status = run(
        "sdk-shards",
        [{"name": "w", "entrypoint": "workloads:shard_worker", "total": 3}],
        config={"out_dir": str(tmp_path)},
    )
    assert status.exit_code == 0, status.reason
    records = sorted(int(p.name.split(".")[0]) for p in tmp_path.iterdir())
    assert records == list(range(100))  # each record once: no loss, no duplicate
    assert any(e.kind == "channel_created" and "shards" in e.message for e in status.events)


def test_prime_master_restart_resumes_without_touching_workers(ray_session: Any) -> None:
    """Known trap: placement groups owned by the PrimeMaster would die with it. Ours are
    detached and named, so a reconstructed PrimeMaster re-adopts them and the workers."""
    import time

    import ray

    from dlu_prime import launcher
    from dlu_prime.naming import NAMESPACE, master_name

    spec = spec_from_dict(
        {
            "name": "sdk-master-kill",
            "device_type": "CPU",
            "device_per_node": 0,
            "config": {"steps": 50},
            "health": {"monitor_interval_s": 0.2},
            "roles": [
                {
                    "name": "w",
                    "entrypoint": "workloads:steps_with_progress",
                    "total": 2,
                    "resources": {"cpu": 0.1},
                }
            ],
        }
    )
    launcher.submit_job(spec, WORKDIR)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        current = launcher.job_status(spec.name)
        if current is not None and current.stage.value == "RUNNING":
            break
        time.sleep(0.2)
    ray.kill(ray.get_actor(master_name(spec.name), namespace=NAMESPACE), no_restart=False)
    final = launcher.wait_job(spec)
    assert final.exit_code == 0, final.reason
    assert any(e.kind == "master_restarted" for e in final.events)
    assert all(a.restart_count == 0 and a.stage == "FINISH" for a in final.roles[0].actors)
