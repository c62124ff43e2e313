"""A job from spec to STOPPED on a real local Ray: stages, exit codes, reasons, and nothing left."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from dlu_api.errors import SpecError
from dlu_api.spec import spec_from_dict
from dlu_api.spec.models import JobSpec
from dlu_api.status import JobStage, JobStatus

pytestmark = [pytest.mark.ray, pytest.mark.timeout(120)]

WORKDIR = str(Path(__file__).parent)


def make_spec(name: str, *roles: dict[str, Any], **job: Any) -> JobSpec:
    data: dict[str, Any] = {
        "name": name,
        "device_type": "CPU",
        "device_per_node": 0,
        "roles": list(roles),
        "health": {"monitor_interval_s": 0.2},
        **job,
    }
    return spec_from_dict(data)


def role(name: str, entrypoint: str, total: int = 1, **extra: Any) -> dict[str, Any]:
    return {"name": name, "entrypoint": entrypoint, "total": total, "resources": {"cpu": 0.1}, **extra}


def leftovers(job: str) -> tuple[list[str], list[tuple[str, str]]]:
    from dlu_prime.scheduler.cleanup import job_actor_names, job_placement_groups

    return job_actor_names(job), job_placement_groups(job)


def assert_nothing_left(job: str) -> None:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        actors, groups = leftovers(job)
        if not actors and not groups:
            return
        time.sleep(0.2)
    assert leftovers(job) == ([], [])


def run(spec: JobSpec) -> JobStatus:
    from dlu_prime import launcher

    return launcher.run_job(spec, WORKDIR)


def stage_path(status: JobStatus) -> list[str]:
    return [e.message.split(":")[0] for e in status.events if e.kind == "stage"]


@pytest.fixture(scope="module")
def side_by_side(ray_session: Any) -> dict[str, JobStatus]:
    """The jobs whose tests look only at their outcome and at what they left, run side by side
    (each its own job, as before): a job's time is mostly waits (actors placed, stages polled,
    three job-level restarts of a failing one), which the others fill. Their tests follow."""
    specs = {
        "ok": [make_spec("life-ok", role("worker", "workloads:quick", total=3))],
        "fail": [make_spec("life-fail", role("worker", "workloads:fail", total=2))],
        "exit": [make_spec("life-exit", role("worker", "workloads:exit_nonzero"))],
        "service": [
            make_spec(
                "life-service",
                role("trainer", "workloads:quick"),
                role("server", "workloads:forever", total=2, is_driver=False),
            )
        ],
        "setup": [make_spec("life-setup", role("worker", "workloads:no_such_function"))],
        # one after the other: the second run of a name over the first one's finished state
        "again": [
            make_spec("life-again", role("worker", "workloads:quick")),
            make_spec("life-again", role("worker", "workloads:fail")),
        ],
        "custom": [
            make_spec(
                "life-custom",
                role(
                    "crew",
                    "workloads:quick",
                    total=3,
                    kind="custom",
                    sub_master="workloads:ReverseStartSubMaster",
                ),
            )
        ],
        "badsub": [
            make_spec(
                "life-badsub",
                role("crew", "workloads:quick", kind="custom", sub_master="workloads:NotASubMaster"),
            )
        ],
    }

    def in_turn(jobs: list[JobSpec]) -> list[JobStatus]:
        return [run(spec) for spec in jobs]

    # four at a time: a PrimeMaster takes 1 of the session Ray's 8 CPUs
    with ThreadPoolExecutor(4) as pool:
        longest_first = ("fail", "again", "exit", "custom", "badsub", "setup", "service", "ok")
        assert sorted(longest_first) == sorted(specs)
        running = {key: pool.submit(in_turn, specs[key]) for key in longest_first}
        done = {key: future.result() for key, future in running.items()}
    finals = {key: statuses[-1] for key, statuses in done.items()}
    finals["again-first"] = done["again"][0]
    return finals


@pytest.mark.timeout(300)  # its setup runs the module's eight jobs, each of which had 120 s
def test_success_walks_every_stage_and_leaves_nothing(side_by_side: dict[str, JobStatus]) -> None:
    status = side_by_side["ok"]
    assert status.stage is JobStage.STOPPED
    assert status.exit_code == 0, status.reason
    assert "worker" in status.reason
    assert stage_path(status) == [
        "INIT -> READY",
        "READY -> RUNNING",
        "RUNNING -> STOPPING",
        "STOPPING -> STOPPED",
    ]
    assert [a.stage for a in status.roles[0].actors] == ["FINISH"] * 3
    assert_nothing_left("life-ok")


def test_failed_driver_reports_traceback_and_leaves_nothing(side_by_side: dict[str, JobStatus]) -> None:
    status = side_by_side["fail"]
    assert status.exit_code == 1
    assert "boom from the test workload" in status.reason
    assert "Traceback" in status.reason
    assert_nothing_left("life-fail")


def test_nonzero_sys_exit_is_a_failure(side_by_side: dict[str, JobStatus]) -> None:
    status = side_by_side["exit"]
    assert status.exit_code == 1
    assert "exited with code 3" in status.reason


def test_job_ends_when_driver_finishes_and_stops_services(side_by_side: dict[str, JobStatus]) -> None:
    status = side_by_side["service"]
    assert status.exit_code == 0, status.reason
    assert "trainer" in status.reason
    assert_nothing_left("life-service")


def test_missing_attribute_fails_self_check_and_stops(side_by_side: dict[str, JobStatus]) -> None:
    status = side_by_side["setup"]
    assert status.stage is JobStage.STOPPED  # never stuck in INIT or READY
    assert status.exit_code == 1
    assert "self check" in status.reason and "no_such_function" in status.reason
    assert_nothing_left("life-setup")


def test_stop_request_stops_a_running_job(ray_session: Any) -> None:
    from dlu_prime import launcher

    spec = make_spec("life-stop", role("worker", "workloads:forever", total=2))
    launcher.submit_job(spec, WORKDIR)
    result: dict[str, JobStatus] = {}
    waiter = threading.Thread(target=lambda: result.update(final=launcher.wait_job(spec)))
    waiter.start()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        current = launcher.job_status(spec.name)
        if current is not None and current.stage is JobStage.RUNNING:
            break
        time.sleep(0.2)
    assert launcher.stop_job(spec.name, "test asked to stop")
    waiter.join(60)
    final = result["final"]
    assert final.exit_code == 130
    assert final.reason == "test asked to stop"
    assert_nothing_left("life-stop")


def test_two_jobs_run_side_by_side(ray_session: Any) -> None:
    from dlu_prime import launcher

    specs = [make_spec(f"life-pair-{i}", role("worker", "workloads:quick", total=2)) for i in range(2)]
    for spec in specs:
        launcher.submit_job(spec, WORKDIR)
    finals = [launcher.wait_job(spec) for spec in specs]
    assert [f.exit_code for f in finals] == [0, 0]
    for spec in specs:
        assert_nothing_left(spec.name)


def test_resubmitted_job_does_not_reuse_finished_state(side_by_side: dict[str, JobStatus]) -> None:
    first, second = side_by_side["again-first"], side_by_side["again"]
    assert first.exit_code == 0
    assert second.exit_code == 1  # a stale "finished" state would have made this 0
    assert sum(1 for e in second.events if e.kind == "job_created") == 1


@pytest.mark.parametrize(
    ("roles", "field", "words"),
    [
        ([role("worker", "no_such_package.module:main")], "roles[worker].entrypoint", "cannot be imported"),
        ([role("worker", "missing_script.py --x 1")], "roles[worker].entrypoint", "does not exist"),
        (
            [{**role("worker", "workloads:quick", total=2), "resources": {"cpu": 100}}],
            "roles[worker].resources.cpu",
            "201 CPU in all (roles[worker] 200, the PrimeMaster 1) but the cluster has 8",
        ),
    ],
)
def test_bad_job_is_rejected_before_any_actor_starts(
    ray_session: Any, roles: list[dict[str, Any]], field: str, words: str
) -> None:
    from dlu_prime import launcher

    spec = make_spec("life-bad", *roles)
    with pytest.raises(SpecError) as caught:
        launcher.submit_job(spec, WORKDIR)
    assert any(p.field == field and words in p.message for p in caught.value.problems), caught.value
    assert leftovers("life-bad") == ([], [])


def test_gpu_demand_above_cluster_is_rejected(ray_session: Any) -> None:
    from dlu_prime import launcher

    spec = spec_from_dict(
        {
            "name": "life-gpus",
            "node_num": 2,
            "device_per_node": 8,
            "roles": [
                {
                    "name": "trainer",
                    "entrypoint": "workloads:quick",
                    "total": 12,
                    "resources": {"cpu": 0.1, "gpu": 1},
                }
            ],
        }
    )
    with pytest.raises(SpecError) as caught:
        launcher.submit_job(spec, WORKDIR)
    assert any("GPU" in p.message for p in caught.value.problems)
    assert leftovers("life-gpus") == ([], [])


def test_custom_role_is_driven_by_its_sub_master(side_by_side: dict[str, JobStatus]) -> None:
    status = side_by_side["custom"]
    assert status.exit_code == 0, status.reason
    actors = status.roles[0].actors
    assert [a.rank for a in actors] == [-1, 0, 1, 2]
    assert actors[0].name == "life-custom.crew.submaster"
    assert [a.stage for a in actors[1:]] == ["FINISH"] * 3
    assert_nothing_left("life-custom")


def test_bad_sub_master_fails_the_self_check(side_by_side: dict[str, JobStatus]) -> None:
    status = side_by_side["badsub"]
    assert status.exit_code == 1
    assert "not a subclass of dlu_prime.SubMaster" in status.reason
    assert_nothing_left("life-badsub")


def test_missing_sub_master_module_is_rejected_up_front(ray_session: Any) -> None:
    from dlu_prime import launcher

    spec = make_spec(
        "life-nosub", role("crew", "workloads:quick", kind="custom", sub_master="no_such_pkg.masters:Boss")
    )
    with pytest.raises(SpecError) as caught:
        launcher.submit_job(spec, WORKDIR)
    assert any(p.field == "roles[crew].sub_master" for p in caught.value.problems), caught.value
    assert leftovers("life-nosub") == ([], [])


def test_unknown_extension_is_rejected_up_front(ray_session: Any) -> None:
    from dlu_prime import launcher

    spec = make_spec("life-noext", role("worker", "workloads:quick"), extension="no-such-cluster")
    with pytest.raises(SpecError) as caught:
        launcher.submit_job(spec, WORKDIR)
    problem = next(p for p in caught.value.problems if p.field == "extension")
    assert "'no-such-cluster' is not registered" in problem.message and "dlu.extensions" in problem.fix
    assert leftovers("life-noext") == ([], [])
