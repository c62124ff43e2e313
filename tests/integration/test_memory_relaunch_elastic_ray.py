"""A memory relaunch of an elastic rank on a real local Ray: rank 1 of a torch elastic role
(2 nodes x 1 process, gloo) whose training process holds more than its role's
`resources.memory` (its agent measures itself and that process) is replaced, through the
ElasticMaster, by an actor that asks Ray for 1.5 times as much in a placement group of its own;
not counted as a fault (no restart of any tier, no in-place restart of the peer whose collective
the replacement broke). Training resumes from the step it saved and the job succeeds, leaving
no actor, placement group, reserved memory or training process behind. The simulator's ranks
(tests/unit/sim/test_memory_relaunch_sim.py) have no agent, no training process and no
rendezvous round."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import Any

import pytest
from proc_checks import gone, snapshot

from dlu_api.spec import spec_from_dict
from dlu_api.spec.units import format_bytes
from dlu_api.status import JobStatus

pytestmark = [pytest.mark.ray, pytest.mark.slow, pytest.mark.timeout(90)]

HERE = Path(__file__).parent
JOB = "mem-elastic"
MiB = 2**20
LIMIT = 1024 * MiB  # an agent and its training process (torch imported) use well under 90% of it
# Rank 1 is taken to 105% of its limit: past 90%, and under the 122% past which a relaunch asks
# for more than 1.5 times the limit (`stats.scaling.memory_relaunch`: 10% over what it uses / 0.9).
TARGET = 1.05
STEPS, STEP_S = 90, 0.2  # about 18 s of training; the relaunch comes within about 10 s
RESTARTS = ("restarted", "died", "failed", "inplace_restart", "master_restarted", "node_relaunch")


def _spec(out: Path) -> Any:
    env = {"MEMORY_DIR": str(out), "MEMORY_STEPS": str(STEPS), "MEMORY_STEP_S": str(STEP_S)}
    return spec_from_dict(
        {
            "name": JOB,
            "device_type": "CPU",
            "device_per_node": 0,
            "node_num": 2,
            "master": {"cpu": 0.1},
            "health": {"monitor_interval_s": 0.5, "stall_timeout_s": None},
            "env": {**env, "MEMORY_HOG_RANK": "1"},
            "roles": [
                {
                    "name": "trainer",
                    "kind": "elastic",
                    "entrypoint": "memory_workloads:elastic_hog",
                    "resources": {"cpu": 0.25, "memory": f"{LIMIT // MiB}MiB"},
                    "elastic": {"nnodes": 2, "nproc_per_node": 1, "node_check": {"enabled": False}},
                }
            ],
            "autoscale": {"mode": "single-job", "settle_s": 2, "measure_s": 2},
        }
    )


def _reserved_mib() -> float:
    import ray

    return (ray.cluster_resources().get("memory", 0.0) - ray.available_resources().get("memory", 0.0)) / MiB


def _mem_groups() -> dict[str, list[float]]:
    """The job's live placement groups of a memory relaunch: their bundles' memory."""
    from ray.util import placement_group_table

    table: dict[str, dict[str, Any]] = placement_group_table()  # pyright: ignore[reportAssignmentType]
    return {
        str(g["name"]): [float(b.get("memory", 0.0)) for b in g["bundles"].values()]
        for g in table.values()
        if str(g.get("name") or "").startswith(JOB) and ".mem" in str(g["name"]) and g["state"] == "CREATED"
    }


def _measured(actor: str) -> tuple[int, int | None]:
    """The rank's memory as its agent measures it for the PrimeMaster (itself and its training
    process), and that process's pid."""
    import ray

    from dlu_prime.naming import NAMESPACE

    found: Any = ray.get(ray.get_actor(actor, namespace=NAMESPACE).status.remote(), timeout=30)
    return int(found.get("memory_bytes") or 0), found.get("process_pid")


def _exited(pid: int, began: int) -> bool:
    """The process `pid` that started at `began` (clock ticks) is gone (its pid may be reused)."""
    found = snapshot(pid)
    return gone(pid) or found is None or found.start != began


def _wait(what: str, check: Any, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


def test_an_elastic_rank_past_its_memory_limit_is_relaunched_with_more_and_training_goes_on(
    ray_session: Any, tmp_path: Path
) -> None:
    from dlu_prime import launcher
    from dlu_prime.scheduler.cleanup import job_actor_names, job_placement_groups

    rank0, rank1 = f"{JOB}.trainer.0", f"{JOB}.trainer.1"
    before = _reserved_mib()
    groups: dict[str, list[float]] = {}
    seen: dict[str, set[int | None]] = {rank0: set(), rank1: set()}  # each rank's memory limits shown
    hold = tmp_path / "hold-mb"
    measured: list[tuple[int, int | None]] = []  # rank 1 before its hold: memory, training process
    reserved: list[tuple[bool, float]] = []  # (relaunched yet, Ray's reserved memory), while it runs

    def watch(status: JobStatus) -> None:
        groups.update(_mem_groups())
        if status.stage.value == "RUNNING":
            kinds = {e.kind for e in status.events}
            if "memory_relaunch_done" in kinds or "memory_relaunch" not in kinds:
                reserved.append(("memory_relaunch_done" in kinds, _reserved_mib()))
        for actor in (a for r in status.roles for a in r.actors if a.name in seen):
            seen[actor.name].add(actor.memory_limit_bytes)
            if actor.name == rank1 and (actor.step or 0) > 0 and not hold.exists():
                used, process = _measured(rank1)
                measured.append((used, process))
                hold.write_text(str(int((TARGET * LIMIT - used) / MiB)))

    status = launcher.run_job(_spec(tmp_path), str(HERE), on_update=watch)
    events = [(e.kind, e.actor, e.message) for e in status.events]
    print("\n".join(f"{k}: {m}" for k, _, m in events if k.startswith(("memory", "actors_restarting"))))
    print("groups:", groups, "limits shown:", seen, "rank 1 before its hold:", measured)
    assert status.exit_code == 0, (status.reason, events)
    ((used, process),) = measured
    assert process is not None and used < 0.9 * LIMIT, measured  # training, no pressure before its hold

    # One relaunch of rank 1, measured past 90% of its limit, with 1.5 times the limit.
    new = LIMIT * 3 // 2
    relaunches = [m for k, _, m in events if k == "memory_relaunch"]
    assert len(relaunches) == 1, events
    said = relaunches[0]
    found = re.fullmatch(
        rf"trainer\.1 at ([\d.]+ (MiB|GiB)) of {format_bytes(LIMIT)} \((\d+)%\): relaunched with {format_bytes(new)}",
        said,
    )
    assert found is not None and int(found.group(3)) >= 90, said
    kinds = [k for k, _, _ in events]
    assert "memory_relaunch_done" in kinds[kinds.index("memory_relaunch") :], events
    assert not [k for k in kinds if k.startswith("failover") or k in RESTARTS], events
    # Its new incarnation asked Ray for the new memory, in a group of its own; the status said so.
    assert groups == {f"{JOB}.pg.trainer.1.mem{new}": [float(new)]}, groups
    assert new in seen[rank1] and seen[rank0] == {None}, seen
    # Rank 1's node group is kept (it is how the job holds that node): Ray reserves the new memory
    # on top (its free resources may lag a change: some sample after the relaunch shows it).
    first = next(mib for done, mib in reserved if not done)
    later = [mib for done, mib in reserved if done]
    assert later and any(abs(mib - first - new / MiB) < 0.5 for mib in later), reserved
    # Not a fault: no count of any tier moved.
    (role,) = status.roles
    counts = (role.restart_count, role.inplace_restart_count, role.sub_master_restart_count)
    job_counts = (status.job_restart_count, status.global_restart_count, status.master_restart_count)
    assert counts == (0, 0, 0) and job_counts == (0, 0, 0) and status.node_restart_count == 0, status
    assert {a.restart_count for a in role.actors} == {0}, role.actors
    # Training went on from where it was: both ranks' last processes resumed and reached the end.
    runs = [json.loads(p.read_text()) for p in sorted(tmp_path.glob("run-*.json"))]
    print("training processes:", runs)
    assert sorted(r["rank"] for r in runs) == [0, 0, 1, 1], runs  # one new round, no other restart
    hogs = [r for r in runs if r["held_mb"]]
    assert [(r["rank"], r["start"]) for r in hogs] == [(1, 0)], runs
    assert 0 < hogs[0]["end"] < STEPS, runs  # the hog was relaunched while it trained
    last = {r["rank"]: r for r in sorted(runs, key=lambda r: r["start"])}
    assert all(r["end"] == STEPS and r["start"] > 0 for r in last.values()), runs
    assert (tmp_path / "step").read_text() == str(STEPS)
    # Nothing left behind: actors, groups, the memory they reserved, every training process.
    assert job_actor_names(JOB) == [] and job_placement_groups(JOB) == []
    _wait("every training process to exit", lambda: all(_exited(r["pid"], r["began"]) for r in runs))
    _wait("Ray to give the job's memory back", lambda: abs(_reserved_mib() - before) < 0.5)
