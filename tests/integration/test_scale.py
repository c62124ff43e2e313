"""`dlu scale` of a simple role on a real local Ray: untouched actors keep their processes, new
ones run, surplus ones are gone with their placement groups; a PrimeMaster SIGKILLed in the
middle of a resize finishes it after its self-recovery, counted once, no actor duplicated; bad
requests leave the running job untouched."""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

import pytest
from lm_jobs import status_of, wait_until

from dlu_api.spec import spec_from_dict
from dlu_api.spec.models import JobSpec
from dlu_api.status import JobStatus

pytestmark = [pytest.mark.ray, pytest.mark.timeout(240)]

HERE = str(Path(__file__).parent)


def scale_spec(
    name: str, workers: int = 2, entrypoint: str = "scale_workloads:forever", **env: str
) -> JobSpec:
    def role(role_name: str, total: int, driver: bool) -> dict[str, Any]:
        return {
            "name": role_name,
            "entrypoint": entrypoint if role_name == "workers" else "scale_workloads:forever",
            "total": total,
            "is_driver": driver,
            "resources": {"cpu": 0.05},
            "env": dict(env),
        }

    return spec_from_dict(
        {
            "name": name,
            "device_type": "CPU",
            "device_per_node": 0,
            "roles": [role("trainer", 1, True), role("workers", workers, False)],
            "health": {"monitor_interval_s": 0.2},
        }
    )


def actor_pid(actor: str) -> int:
    import ray

    from dlu_prime.naming import NAMESPACE

    return int(ray.get(ray.get_actor(actor, namespace=NAMESPACE).status.remote(), timeout=30)["pid"])


def leftovers(job: str) -> tuple[list[str], list[str]]:
    from dlu_prime.scheduler.cleanup import job_actor_names, job_placement_groups

    return job_actor_names(job), sorted(name for _, name in job_placement_groups(job))


def running(job: str, role: str, size: int) -> bool:
    status = status_of(job)
    roles = {r.name: r for r in status.roles} if status else {}
    found = roles.get(role)
    return found is not None and found.size == size and all(a.stage == "RUNNING" for a in found.actors)


def events(status: JobStatus | None, kind: str) -> list[str]:
    return [e.message for e in (status.events if status else []) if e.kind == kind]


def stop_and_check_clean(spec: JobSpec) -> None:
    from dlu_prime import launcher

    launcher.stop_job(spec.name)
    assert launcher.wait_job(spec).stage.value == "STOPPED"
    wait_until("nothing left", lambda: leftovers(spec.name) == ([], []), timeout_s=30)


def test_scale_2_to_6_to_3_touches_only_what_it_adds_or_stops(ray_session: Any) -> None:
    from dlu_prime import launcher

    spec = scale_spec("scale-up-down")
    job = spec.name
    launcher.submit_job(spec, HERE)
    wait_until("running", lambda: running(job, "workers", 2))
    names = [f"{job}.workers.{r}" for r in range(6)]
    kept = {n: actor_pid(n) for n in names[:2]}
    trainer = actor_pid(f"{job}.trainer.0")

    grown = launcher.scale_job(job, "workers", 6)
    assert grown["done"] and not grown["failed"], grown
    wait_until("6 running", lambda: running(job, "workers", 6))
    assert {n: actor_pid(n) for n in names[:2]} == kept
    assert actor_pid(f"{job}.trainer.0") == trainer
    actors, groups = leftovers(job)
    assert set(names) <= set(actors)
    assert [g for g in groups if g.startswith(f"{job}.pg.workers.")] == [
        f"{job}.pg.workers.{r}" for r in range(2, 6)
    ]

    shrunk = launcher.scale_job(job, "workers", 3)
    assert shrunk["done"] and not shrunk["failed"], shrunk
    wait_until("3 running", lambda: running(job, "workers", 3))
    assert {n: actor_pid(n) for n in names[:2]} == kept
    actors, groups = leftovers(job)
    assert [n for n in names if n in actors] == names[:3]  # the surplus ones are gone
    assert [g for g in groups if g.startswith(f"{job}.pg.workers.")] == [f"{job}.pg.workers.2"]

    status = status_of(job)
    assert status is not None and status.stage.value == "RUNNING"
    workers = next(r for r in status.roles if r.name == "workers")
    assert (workers.size, workers.resize_count, [a.rank for a in workers.actors]) == (3, 2, [0, 1, 2])
    done = events(status, "resize_done")
    assert [m.split(" done")[0] for m in done] == ["resize 2 -> 6 (dlu scale)", "resize 6 -> 3 (dlu scale)"]
    assert not events(status, "failover_started") and not events(status, "died")
    stop_and_check_clean(spec)


def test_bad_requests_are_refused_naming_the_fix_and_the_job_is_untouched(ray_session: Any) -> None:
    from dlu_prime import launcher

    spec = scale_spec("scale-bad")
    job = spec.name
    launcher.submit_job(spec, HERE)
    wait_until("running", lambda: running(job, "workers", 2))
    pids = {r: actor_pid(f"{job}.workers.{r}") for r in range(2)}
    for role, size, words in [
        ("nope", 3, "no role 'nope'; its roles are trainer, workers"),
        ("workers", 0, "size 0 for role 'workers' is not allowed: give a whole number >= 1"),
    ]:
        with pytest.raises(ValueError, match=words):
            launcher.scale_job(job, role, size)
    with pytest.raises(LookupError, match="not running"):
        launcher.scale_job("scale-no-such-job", "workers", 2)
    status = status_of(job)
    assert status is not None and not events(status, "resize_started")
    assert {r: actor_pid(f"{job}.workers.{r}") for r in range(2)} == pids
    stop_and_check_clean(spec)


def test_prime_master_killed_during_a_resize_finishes_it_once(ray_session: Any) -> None:
    from dlu_prime import launcher
    from dlu_prime.naming import NAMESPACE, master_name

    spec = scale_spec("scale-kill", SCALE_SLOW_FROM="2", SCALE_SLOW_S="4")
    job = spec.name
    launcher.submit_job(spec, HERE)
    wait_until("running", lambda: running(job, "workers", 2))
    import ray

    master = ray.get_actor(master_name(job), namespace=NAMESPACE)
    master_pid = int(ray.get(master.ping.remote(), timeout=30)["pid"])
    kept = {r: actor_pid(f"{job}.workers.{r}") for r in range(2)}
    master.scale.remote("workers", 4)  # its answer is lost with the PrimeMaster
    wait_until("resize saved", lambda: bool(events(status_of(job), "resize_started")))
    assert not events(status_of(job), "resize_done")  # the new actors' setup takes seconds
    os.kill(master_pid, signal.SIGKILL)

    wait_until("4 running", lambda: running(job, "workers", 4))
    status = status_of(job)
    assert status is not None and status.master_restart_count == 1
    assert len(events(status, "resize_started")) == 1 and len(events(status, "resize_done")) == 1
    workers = next(r for r in status.roles if r.name == "workers")
    assert (workers.size, workers.resize_count) == (4, 1)
    actors, groups = leftovers(job)
    names = [f"{job}.workers.{r}" for r in range(4)]
    assert sorted(a for a in actors if ".workers." in a) == names  # named once each
    assert [g for g in groups if ".pg.workers." in g] == [f"{job}.pg.workers.{r}" for r in (2, 3)]
    assert {r: actor_pid(f"{job}.workers.{r}") for r in range(2)} == kept
    assert not events(status, "failover_started")
    stop_and_check_clean(spec)


def test_dlu_scale_survives_its_prime_master_killed_and_reports_the_real_outcome(ray_session: Any) -> None:
    """Issue 27 defect 5: `dlu scale` failed with ActorUnavailableError ("may or may not have
    been executed") while the rebuilt PrimeMaster completed the saved resize. The request now
    carries an id: it is asked again of the rebuilt PrimeMaster, which answers with what the
    resize came to instead of running it twice."""
    import threading

    import ray

    from dlu_prime import launcher
    from dlu_prime.naming import NAMESPACE, master_name

    spec = scale_spec("scale-kill-cli", SCALE_SLOW_FROM="2", SCALE_SLOW_S="4")
    job = spec.name
    launcher.submit_job(spec, HERE)
    wait_until("running", lambda: running(job, "workers", 2))
    master = ray.get_actor(master_name(job), namespace=NAMESPACE)
    master_pid = int(ray.get(master.ping.remote(), timeout=30)["pid"])
    answer: dict[str, Any] = {}

    def scale() -> None:
        try:
            answer["result"] = launcher.scale_job(job, "workers", 4)
        except Exception as exc:
            answer["error"] = f"{type(exc).__name__}: {exc}"

    caller = threading.Thread(target=scale)
    caller.start()
    wait_until("resize saved", lambda: bool(events(status_of(job), "resize_started")))
    os.kill(master_pid, signal.SIGKILL)
    caller.join(180)
    assert "error" not in answer, answer.get("error")
    result = answer["result"]
    assert (result["old_size"], result["new_size"], result["done"], result["failed"]) == (2, 4, True, False)
    assert "resize 2 -> 4 (dlu scale) done" in result["message"]
    status = status_of(job)
    assert status is not None and status.master_restart_count == 1
    assert len(events(status, "resize_started")) == 1 and len(events(status, "resize_done")) == 1
    workers = next(r for r in status.roles if r.name == "workers")
    assert (workers.size, workers.resize_count) == (4, 1)
    stop_and_check_clean(spec)


def test_an_added_actor_that_dies_is_replaced_in_its_own_placement_group(ray_session: Any) -> None:
    from dlu_prime import launcher

    spec = scale_spec("scale-fail")
    job = spec.name
    launcher.submit_job(spec, HERE)
    wait_until("running", lambda: running(job, "workers", 2))
    assert launcher.scale_job(job, "workers", 3)["done"]
    wait_until("3 running", lambda: running(job, "workers", 3))
    added = f"{job}.workers.2"
    before = actor_pid(added)
    os.kill(before, signal.SIGKILL)
    wait_until("recovered", lambda: bool(events(status_of(job), "failover_done")))
    wait_until("3 running again", lambda: running(job, "workers", 3))
    assert actor_pid(added) != before
    actors, groups = leftovers(job)
    assert sorted(a for a in actors if ".workers." in a) == [f"{job}.workers.{r}" for r in range(3)]
    assert [g for g in groups if ".pg.workers." in g] == [f"{job}.pg.workers.2"]
    stop_and_check_clean(spec)


def test_shards_of_stopped_workers_go_back_and_every_record_is_counted_once(ray_session: Any) -> None:
    """Dynamic sharding across `dlu scale` 4 -> 2: the shards the two stopped workers held go
    back to todo, the two kept workers finish the dataset, and the counts every worker kept
    with its completions add up to the dataset exactly (nothing lost, nothing done twice)."""
    from dlu_prime import launcher
    from dlu_prime.runtime.sharding import ShardQueue

    spec = scale_spec("scale-shards", workers=4, entrypoint="scale_workloads:slow_shards")
    job = spec.name
    launcher.submit_job(spec, HERE)
    wait_until("running", lambda: running(job, "workers", 4))
    queue_holder: list[ShardQueue] = []

    def holding() -> set[str]:
        if not queue_holder:
            try:
                queue_holder.append(ShardQueue.open(job, "data"))
            except Exception:
                return set()
        return set(queue_holder[0].doing().values())

    stopped = {f"{job}.workers.2", f"{job}.workers.3"}
    wait_until("workers 2 and 3 holding shards", lambda: stopped <= holding())
    shrunk = launcher.scale_job(job, "workers", 2)
    assert shrunk["done"] and not shrunk["failed"], shrunk
    queue = queue_holder[0]
    wait_until("the dataset done", queue.finished, timeout_s=120)
    progress = queue.progress()
    assert progress["done"] == 20 and not queue.doing(), progress
    workers = [f"{job}.workers.{r}" for r in range(4)]
    assert sum(queue.restore(w) or 0 for w in workers) == 60
    status = status_of(job)
    (told,) = events(status, "shards_requeued")
    assert "shard queue 'data'" in told
    assert not events(status, "failover_started") and not events(status, "died")
    stop_and_check_clean(spec)
