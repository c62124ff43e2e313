"""Jobs whose state lives in Redis: outages, PrimeMaster loss, racing masters, and `dlu resume`
after the Ray cluster that ran the job is gone. Real Redis, real Ray."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from short_tmp import short_tmp_dir

from dlu_api.spec import spec_from_dict
from dlu_api.status import JobStage
from dlu_prime.master.state import JobState

pytestmark = [pytest.mark.ray, pytest.mark.timeout(240)]

HERE = Path(__file__).parent


@pytest.fixture(scope="module")
def redis_server() -> Iterator[Any]:
    from dlu_store_redis.testing import RedisServer

    with RedisServer(appendonly=True) as server:
        yield server


def redis_job(name: str, url: str, steps: int = 30, prefix: str = "dlu-test") -> Any:
    return spec_from_dict(
        {
            "name": name,
            "device_type": "CPU",
            "device_per_node": 0,
            "config": {"steps": steps},
            "health": {"monitor_interval_s": 0.2},
            "state_store": {
                "name": "redis",
                "options": {
                    "url": url,
                    "key_prefix": prefix,
                    "retries": 1,
                    "retry_backoff_s": 0.05,
                    "connect_timeout_s": 0.5,
                    "operation_timeout_s": 1.0,
                },
            },
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


def stored(spec: Any) -> JobState:
    from dlu_prime.state.base import create_state_store

    found = create_state_store(spec.state_store.name, spec.state_store.options).get(spec.name)
    assert found is not None
    return JobState.loads(found.data)


def wait_running(name: str, timeout: float = 60) -> None:
    from dlu_prime import launcher

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        current = launcher.job_status(name)
        if current is not None and current.stage is JobStage.RUNNING:
            return
        time.sleep(0.2)
    pytest.fail(f"{name} never reached RUNNING")


def test_redis_outage_in_the_middle_of_a_job(ray_session: Any, redis_server: Any) -> None:
    from dlu_prime import launcher

    spec = redis_job("redis-outage", redis_server.url, steps=40)
    launcher.submit_job(spec, str(HERE))
    result: dict[str, Any] = {}
    waiter = threading.Thread(target=lambda: result.update(final=launcher.wait_job(spec)))
    waiter.start()
    wait_running(spec.name)
    redis_server.stop()
    time.sleep(2.0)  # the job keeps running without its store
    redis_server.start()
    waiter.join(120)
    final = result["final"]
    assert final.exit_code == 0, final.reason
    saved = stored(spec)
    assert saved.stage is JobStage.STOPPED and saved.exit_code == 0
    assert [e.message for e in saved.events] == [e.message for e in final.events][-len(saved.events) :]


def test_prime_master_killed_recovers_from_redis(ray_session: Any, redis_server: Any) -> None:
    import ray

    from dlu_prime import launcher
    from dlu_prime.naming import NAMESPACE, master_name

    spec = redis_job("redis-master-kill", redis_server.url, steps=40)
    launcher.submit_job(spec, str(HERE))
    wait_running(spec.name)
    ray.kill(ray.get_actor(master_name(spec.name), namespace=NAMESPACE), no_restart=False)
    final = launcher.wait_job(spec)
    assert final.exit_code == 0, final.reason
    saved = stored(spec)
    assert saved.master_restart_count == 1
    assert any(e.kind == "master_restarted" for e in saved.events)
    assert all(a.restart_count == 0 for a in saved.actors.values())


def test_two_managers_racing_on_one_job_one_is_fenced(redis_server: Any) -> None:
    from dlu_prime.master.manager import FencedError, PrimeManager
    from dlu_prime.state.base import create_state_store

    spec = redis_job("redis-race", redis_server.url)
    store = create_state_store("redis", spec.state_store.options)
    first = PrimeManager.create(spec, _Unused(), store)
    second = PrimeManager(JobState.loads(store.get(spec.name).data), _Unused(), store, first.token)  # type: ignore[union-attr]
    first.record_event("node_check", "first master writes")
    with pytest.raises(FencedError):
        second.record_event("node_check", "stale master writes")
    assert [e.message for e in stored(spec).events][-1] == "first master writes"


class _Unused:
    """A scheduler the racing managers never reach."""

    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"scheduler.{name} must not be called")


def test_resume_after_the_ray_cluster_is_gone(redis_server: Any, tmp_path: Path) -> None:
    spec_file = tmp_path / "job.yaml"
    spec = redis_job("redis-resume", redis_server.url, steps=200)
    spec_file.write_text(json.dumps(spec.model_dump(mode="json")))
    dlu = str(Path(sys.executable).parent / "dlu")

    def env() -> dict[str, str]:
        return {
            **os.environ,
            "RAY_TMPDIR": short_tmp_dir("dlu-res-"),
            "DLU_HOME": str(tmp_path / "home"),
        }

    first = subprocess.Popen(
        [dlu, "run", str(spec_file)],
        cwd=HERE,
        env=env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                if stored(spec).stage is JobStage.RUNNING:
                    break
            except AssertionError:
                pass
            time.sleep(0.3)
        else:
            pytest.fail("the first run never reached RUNNING")
    finally:
        # The whole first cluster goes away: the driver, its embedded Ray, every actor.
        os.killpg(first.pid, signal.SIGKILL)
        first.wait(30)
    assert stored(spec).stage is JobStage.RUNNING

    data = spec.model_dump(mode="json")
    data["config"]["steps"] = 5  # the resumed run finishes quickly
    spec_file.write_text(json.dumps(data))
    second = subprocess.run(
        [dlu, "resume", str(spec_file)],
        cwd=HERE,
        env=env(),
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-3000:]
    saved = stored(spec)
    assert saved.stage is JobStage.STOPPED and saved.exit_code == 0
    assert saved.job_restart_count == 1
    assert any(e.kind == "job_resumed" for e in saved.events)
    assert any(e.kind == "job_created" for e in saved.events)  # the first run's timeline is kept


def test_finished_job_state_expires_after_the_retention_period(ray_session: Any, redis_server: Any) -> None:
    from dlu_prime import launcher

    spec = redis_job("redis-retain", redis_server.url, steps=2)
    data = spec.model_dump(mode="json")
    data["state_store"]["options"]["retention_s"] = 3600
    spec = spec_from_dict(data)
    final = launcher.run_job(spec, str(HERE))
    assert final.exit_code == 0, final.reason
    ttl = redis_server.client().ttl(f"dlu-test:job:{spec.name}")
    assert 0 < ttl <= 3600


HANG_S = 6.0  # longer than redis_job's retry budget (2 attempts of 1 s each)


def test_a_hung_store_executing_a_write_late_does_not_orphan_the_job(
    ray_session: Any, redis_server: Any
) -> None:
    """Issue 27 defect 1: Redis SIGSTOPped longer than a write's retry budget while the write is
    in flight, then SIGCONTed (it executes the write late). Before the settle rule the
    PrimeMaster's next write lost to its own late write and it stopped acting as "fenced":
    training ran on unmonitored and `dlu run` never ended."""
    from dlu_prime import launcher

    spec = redis_job("redis-hang", redis_server.url, steps=60)
    launcher.submit_job(spec, str(HERE))
    result: dict[str, Any] = {}
    waiter = threading.Thread(target=lambda: result.update(final=launcher.wait_job(spec)))
    waiter.start()
    wait_running(spec.name)
    pid = redis_server.pid
    assert pid is not None
    os.kill(pid, signal.SIGSTOP)
    try:
        # a state change whose write hangs: the failover of a rank marked unhealthy
        launcher.debug_job(spec.name, "mark_unhealthy", "w", 0)
        deadline = time.monotonic() + 60
        while not _has_event(spec.name, "state_store_unavailable"):
            assert time.monotonic() < deadline, "the outage never showed in the job's status"
            time.sleep(0.2)
        time.sleep(HANG_S)  # more writes pile up behind the hung server meanwhile
    finally:
        os.kill(pid, signal.SIGCONT)
    waiter.join(180)
    final = result["final"]
    assert final.exit_code == 0, final.reason
    kinds = [e.kind for e in final.events]
    assert "state_store_unavailable" in kinds and "state_store_restored" in kinds, kinds
    assert kinds.index("state_store_unavailable") < kinds.index("state_store_restored")
    saved = stored(spec)
    assert saved.stage is JobStage.STOPPED and saved.exit_code == 0
    assert saved.master_restart_count == 0
    assert [e.kind for e in saved.events].count("state_store_restored") == 1
    assert [e.message for e in saved.events] == [e.message for e in final.events][-len(saved.events) :]


def _has_event(job: str, kind: str) -> bool:
    from dlu_prime import launcher

    status = launcher.job_status(job, events=200)
    return status is not None and any(e.kind == kind for e in status.events)


@pytest.mark.parametrize("steps", [50, pytest.param(120, marks=pytest.mark.soak)], ids=["short", "long"])
def test_a_calm_store_raises_no_outage(ray_session: Any, redis_server: Any, steps: int) -> None:
    """Soak of the writer's timers (slow-write warning 2 s, status lock wait 0.5 s, probe): a job
    of many multiples of them (steps of 0.1 s) with a healthy store records no outage and no
    restart."""
    from dlu_prime import launcher

    spec = redis_job(f"redis-calm-{steps}", redis_server.url, steps=steps)
    launcher.submit_job(spec, str(HERE))
    wait_running(spec.name)
    polls = 0
    while (current := launcher.job_status(spec.name)) is not None and current.stage is not JobStage.STOPPED:
        polls += 1  # status calls all along, as a console makes them
        time.sleep(0.1)
    final = launcher.wait_job(spec)
    assert final.exit_code == 0, final.reason
    assert polls > 10
    kinds = [e.kind for e in stored(spec).events]
    assert not [k for k in kinds if k.startswith("state_store_")], kinds
    assert final.master_restart_count == 0 and all(r.restart_count == 0 for r in final.roles)
