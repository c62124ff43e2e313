"""torchrun's worker variables from a rendezvous round, and its error files read back."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dlu.elastic.v1 import elastic_pb2 as pb
from dlu_elastic.worker import error_file
from dlu_elastic.worker.torchrun_env import restart_count, torchrun_env

pytestmark = pytest.mark.timeout(10)


def env_of(round_: int, rank: int, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    for name in ("OMP_NUM_THREADS", "TORCH_NCCL_ASYNC_ERROR_HANDLING", "TORCHELASTIC_SIGNALS_TO_HANDLE"):
        monkeypatch.delenv(name, raising=False)
    state = pb.RendezvousState(round=round_, world_size=6, rank_offset=rank, master_addr="h", master_port=7)
    return torchrun_env(
        state,
        restarts=restart_count(state),
        local_rank=rank % 2,
        local_world_size=2,
        node_rank=rank // 2,
        role="trainer",
        run_id="j-trainer",
        max_restarts=3,
    )


def test_the_round_gives_the_restart_count_and_the_group_sizes(monkeypatch: pytest.MonkeyPatch) -> None:
    env = env_of(3, 5, monkeypatch)
    assert env["TORCHELASTIC_RESTART_COUNT"] == "2"  # rounds are numbered from 1
    assert (env["RANK"], env["LOCAL_RANK"], env["GROUP_RANK"], env["GROUP_WORLD_SIZE"]) == (
        "5",
        "1",
        "2",
        "3",
    )
    assert (env["ROLE_NAME"], env["ROLE_WORLD_SIZE"], env["TORCHELASTIC_MAX_RESTARTS"]) == (
        "trainer",
        "6",
        "3",
    )
    assert (env["TORCH_NCCL_ASYNC_ERROR_HANDLING"], env["OMP_NUM_THREADS"]) == ("1", "1")
    assert restart_count(pb.RendezvousState()) == 0  # an unset round never goes negative


def test_the_count_never_goes_back_when_a_new_elastic_master_numbers_rounds_from_1() -> None:
    assert restart_count(pb.RendezvousState(round=4), previous=1) == 3  # rounds skipped: counted
    assert restart_count(pb.RendezvousState(round=1), previous=3) == 4  # a replaced master's round 1
    assert restart_count(pb.RendezvousState(round=2), previous=4) == 5


def test_what_the_launching_environment_chose_is_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TORCH_NCCL_ASYNC_ERROR_HANDLING", "3")
    monkeypatch.setenv("OMP_NUM_THREADS", "4")
    state = pb.RendezvousState(round=1, world_size=2, rank_offset=0)
    env = torchrun_env(
        state, restarts=0, local_rank=0, local_world_size=2, node_rank=0, role="r", run_id="x", max_restarts=0
    )
    assert env["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "3" and "OMP_NUM_THREADS" not in env


def test_a_record_error_file_is_read_back_and_a_stale_one_removed(tmp_path: Path) -> None:
    path = error_file.error_file(tmp_path, "j", "run", "trainer", 1)
    path.parent.mkdir(parents=True)
    path.write_text("stale")
    assert error_file.prepare(path) == str(path) and not path.exists()
    assert error_file.read_error(str(path)) is None  # no file: the rank did not use @record
    torch_format = {
        "message": {
            "message": "RuntimeError: boom",
            "extraInfo": {
                "py_callstack": "Traceback (most recent call last):\n  ...\nRuntimeError: boom",
                "timestamp": "1",
            },
        }
    }
    path.write_text(json.dumps(torch_format))
    assert error_file.read_error(str(path)) == "Traceback (most recent call last):\n  ...\nRuntimeError: boom"
    path.write_text(json.dumps({"message": "written by hand"}))
    assert error_file.read_error(str(path)) == "written by hand"
    path.write_text("{not json")
    assert error_file.read_error(str(path)) is None


def test_a_failure_reports_the_error_file_when_there_is_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "e.json"
    monkeypatch.setenv(error_file.ENV, str(path))
    assert error_file.failure_text("the traceback") == "the traceback"
    path.write_text(json.dumps({"message": {"message": "ValueError: x", "extraInfo": {}}}))
    assert error_file.failure_text("the traceback") == f"(from the rank's error file {path})\nValueError: x"
