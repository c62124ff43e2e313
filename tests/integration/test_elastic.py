"""Elastic roles on a real local Ray: rendezvous, torchrun env, node check verdicts, and the
in-place restart (tier 1) that resumes from the checkpoint with no actor restart."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from dlu_api import from_torchrun_cmd
from dlu_api.spec import spec_from_dict
from dlu_api.status import JobStatus

pytestmark = [pytest.mark.ray, pytest.mark.slow, pytest.mark.timeout(300)]

HERE = Path(__file__).parent
ROOT = HERE.parents[1]


def elastic_job(name: str, entrypoint: str, nnodes: int, nproc: int, **extra: Any) -> Any:
    node_check = extra.pop("node_check", {"enabled": False})
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
                    "entrypoint": entrypoint,
                    "resources": {"cpu": 0.25},
                    "elastic": {
                        "nnodes": nnodes,
                        "nproc_per_node": nproc,
                        "node_check": {"matmul_size": 64, "allreduce_mb": 0.5, "timeout_s": 30, **node_check},
                    },
                    **extra,
                }
            ],
        }
    )


def run(spec: Any, workdir: Path = HERE) -> JobStatus:
    from dlu_prime import launcher

    return launcher.run_job(spec, str(workdir))


def test_function_entrypoint_gets_torchrun_env_and_process_group(
    side_by_side: dict[str, JobStatus], outs: dict[str, Path]
) -> None:
    status, tmp_path = side_by_side["env"], outs["env"]
    assert status.exit_code == 0, status.reason
    records = [json.loads(p.read_text()) for p in sorted(tmp_path.glob("allreduce-*.json"))]
    assert [r["sum"] for r in records] == [10.0] * 4
    assert sorted(r["rank"] for r in records) == [0, 1, 2, 3]
    for r in records:
        env = r["env"]
        assert env["WORLD_SIZE"] == "4" and env["LOCAL_WORLD_SIZE"] == "2"
        assert env["GROUP_RANK"] == str(int(env["RANK"]) // 2)  # node-major ranks
        assert env["LOCAL_RANK"] == str(int(env["RANK"]) % 2)
        for name in ("MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_RUN_ID"):
            assert name in env
        assert r["worker"]["role"] == "trainer"
    assert any(e.kind == "endpoint" for e in status.events)


def torchrun_job() -> Any:
    spec = from_torchrun_cmd(
        "torchrun --nnodes=2 --nproc-per-node=2 examples/elastic/allreduce.py",
        name="el-torchrun",
        device_type="CPU",
    )
    data = spec.model_dump(mode="json")
    data["roles"][0]["elastic"]["node_check"]["enabled"] = False
    data["roles"][0]["resources"]["cpu"] = 0.25
    return spec_from_dict(data)


def test_unmodified_torchrun_script(side_by_side: dict[str, JobStatus]) -> None:
    status = side_by_side["torchrun"]
    assert status.exit_code == 0, status.reason


LM_SCRIPT = "examples/elastic/train_lm.py --steps 16 --checkpoint-every 4"


def clean_job(tmp_path: Path) -> Any:
    return elastic_job("el-clean", f"{LM_SCRIPT} --checkpoint-dir {tmp_path / 'clean'}", 2, 1)


def crash_job(tmp_path: Path) -> Any:
    return elastic_job(
        "el-crash",
        f"{LM_SCRIPT} --checkpoint-dir {tmp_path / 'crash'} --crash-at-step 10 --crash-rank 1",
        2,
        1,
    )


def test_inplace_restart_resumes_and_matches_a_clean_run(
    side_by_side: dict[str, JobStatus], outs: dict[str, Path]
) -> None:
    clean, crash, tmp_path = side_by_side["clean"], side_by_side["crash"], outs["inplace"]
    assert clean.exit_code == 0, clean.reason
    assert crash.exit_code == 0, crash.reason
    restarts = [e for e in crash.events if e.kind == "inplace_restart"]
    assert len(restarts) == 1 and "injected crash at step 10" in restarts[0].message
    done = [e for e in crash.events if e.kind == "failover_done"]  # timed by the ElasticMaster
    assert [(e.tier, e.role) for e in done] == [("in_place", "trainer")], done
    assert done[0].duration_s is not None and done[0].duration_s > 0
    assert all(a.restart_count == 0 for a in crash.roles[0].actors)  # no actor was restarted
    assert (tmp_path / "crash" / "crashed-at-10").exists()
    # The flash checkpoint of step 10 (every step, in the agents' memory) is where it resumed.
    restored = [e.message for e in crash.events if e.kind == "checkpoint_restored"]
    assert restored == ["resumed step 10 from memory; steps lost: 0"], restored
    # Deterministic training resumed from the step-10 checkpoint ends exactly where a clean run does.
    assert (tmp_path / "crash" / "final_loss.txt").read_text() == (
        tmp_path / "clean" / "final_loss.txt"
    ).read_text()


def test_restart_limit_stops_the_job_with_the_reason(side_by_side: dict[str, JobStatus]) -> None:
    status = side_by_side["limit"]
    assert status.exit_code == 1
    assert any(e.kind == "restart_limit" for e in status.events)
    assert sum(1 for e in status.events if e.kind == "inplace_restart") == 1


def rpc_job() -> Any:
    return spec_from_dict(
        {
            "name": "el-rpc",
            "device_type": "CPU",
            "device_per_node": 0,
            "health": {"monitor_interval_s": 0.2},
            "roles": [
                {"name": "trainer", "entrypoint": "workloads:drive_policy", "resources": {"cpu": 0.1}},
                {
                    "name": "policy",
                    "kind": "elastic",
                    "entrypoint": "workloads:PolicyShard",
                    "is_driver": False,
                    "resources": {"cpu": 0.25},
                    "elastic": {"nnodes": 1, "nproc_per_node": 2, "node_check": {"enabled": False}},
                },
            ],
        }
    )


def test_class_entrypoint_with_rpc_serves_a_trainer(side_by_side: dict[str, JobStatus]) -> None:
    status = side_by_side["rpc"]
    assert status.exit_code == 0, status.reason


FAULTY_TIMEOUT_S = 10


@pytest.fixture(scope="module")
def outs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Each job's folder of outputs, which its test reads after the job."""
    return {key: tmp_path_factory.mktemp(key) for key in ("env", "inplace")}


@pytest.fixture(scope="module")
def side_by_side(
    ray_session: Any, tmp_path_factory: pytest.TempPathFactory, outs: dict[str, Path]
) -> dict[str, JobStatus]:
    """Every job of the module, run side by side (each its own job, as before); their tests look
    at their outcome and at what they wrote (`outs`). The node check's faulty node leaves its
    partners waiting out the probe's timeout (twice in the job that stops), time in which the
    others run. The two faulty-node jobs use a 10 s timeout, not 30 s: their partners only wait
    it out, and a healthy probe (a 64x64 matmul, a 0.5 MB allreduce and a gloo rendezvous of two
    processes started together) needs far less."""
    counter = tmp_path_factory.mktemp("node-check") / "faults"
    specs = {
        "env": elastic_job(
            "el-env", "elastic_workloads:allreduce_sum", 2, 2, env={"OUT_DIR": str(outs["env"])}
        ),
        "clean": (clean_job(outs["inplace"]), ROOT),
        "crash": (crash_job(outs["inplace"]), ROOT),
        "torchrun": (torchrun_job(), ROOT),
        "limit": elastic_job("el-limit", "elastic_workloads:raise_error", 1, 2, max_restart=1),
        "rpc": rpc_job(),
        "straggler": elastic_job(
            "el-slow",
            "elastic_workloads:allreduce_only",
            3,
            1,
            node_check={"enabled": True, "straggler_ratio": 3.0},
            env={"DLU_NODE_CHECK_FAULT_NODE": "node-2", "DLU_NODE_CHECK_DELAY_S": "1.5"},
        ),
        "faulty": elastic_job(
            "el-faulty",
            "elastic_workloads:allreduce_only",
            3,
            1,
            node_check={"enabled": True, "timeout_s": FAULTY_TIMEOUT_S},
            env={"DLU_NODE_CHECK_FAULT_NODE": "node-1", "DLU_NODE_CHECK_FAIL": "1"},
        ),
        "recheck": elastic_job(
            "el-recheck",
            "elastic_workloads:allreduce_only",
            3,
            1,
            node_check={"enabled": True, "timeout_s": FAULTY_TIMEOUT_S},
            env={
                "DLU_NODE_CHECK_FAULT_NODE": "node-1",
                "DLU_NODE_CHECK_FAIL": "1",
                "DLU_NODE_CHECK_FAULT_COUNTER": str(counter),
                "DLU_NODE_CHECK_FAULT_TIMES": "2",  # both rounds of the first check, not the re-check
            },
        ),
    }
    # four at a time, the longest first: a PrimeMaster takes 1 of the session Ray's 8 CPUs
    longest_first = ("faulty", "recheck", "straggler", "torchrun", "clean", "crash", "env", "rpc", "limit")
    assert sorted(longest_first) == sorted(specs)
    with ThreadPoolExecutor(4) as pool:
        running = {
            key: pool.submit(run, *(job if isinstance(job, tuple) else (job,)))
            for key, job in ((key, specs[key]) for key in longest_first)
        }
        return {key: future.result() for key, future in running.items()}


def test_node_check_reports_a_straggler(side_by_side: dict[str, JobStatus]) -> None:
    status = side_by_side["straggler"]
    assert status.exit_code == 0, status.reason
    verdicts = [e.message for e in status.events if e.kind == "straggler"]
    assert verdicts and "node-2" in verdicts[0]


def test_comm_fault_node_check_failure_stops_the_job_naming_the_node(
    side_by_side: dict[str, JobStatus],
) -> None:
    status = side_by_side["faulty"]
    assert status.stage.value == "STOPPED"  # never stuck in READY
    assert status.exit_code == 1
    assert "node check failed" in status.reason and "node-1" in status.reason


def test_comm_fault_faulty_node_gets_its_actors_restarted_then_trains(
    side_by_side: dict[str, JobStatus],
) -> None:
    status = side_by_side["recheck"]
    assert status.exit_code == 0, status.reason
    kinds = [e.kind for e in status.events]
    assert "faulty_node" in kinds and "actors_restarted" in kinds
    assert kinds.count("node_check") == 2  # checked, replaced node-1's actor, checked again
    actors = {a.name: a for a in status.roles[0].actors}
    assert actors["el-recheck.trainer.1"].restart_count == 1
    assert actors["el-recheck.trainer.0"].restart_count == 0
    assert status.roles[0].restart_count == 1
