"""Every case of the GPU table, checked in the training process itself: forked from a real zygote
with torch preloaded, each rank sees its own CUDA_VISIBLE_DEVICES, LOCAL_RANK and device
before its first line runs, whatever the zygote's own environment held, and torch has not
been told about CUDA (the child is no bad fork). No GPU needed: nothing here calls CUDA.

The ranks are started as an ElasticWorker starts them: the actor's environment is what Ray and
`device_env` gave it (`ElasticWorkerActor.setup` puts `DeviceEnv.env()` into os.environ; Ray sets
CUDA_VISIBLE_DEVICES itself when it allocates), the launcher forks with that environment, and
the spec's device is the actor's DLU_DEVICE (`ElasticWorkerActor._device`).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from dlu_api.spec import spec_from_dict
from dlu_elastic.worker.process import ProcessSpec, TrainingLauncher
from dlu_prime import zygote
from dlu_prime.scheduler import DeviceEnv, device_env

HERE = Path(__file__).resolve().parent
# What the zygote's environment holds when it starts: another actor's view, which must not leak.
ZYGOTE_ENV = {
    "CUDA_VISIBLE_DEVICES": "7",
    "LOCAL_RANK": "99",
    "DLU_DEVICE": "cuda:7",
    "DLU_DEVICES": "cuda:7",
}

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


@dataclass(frozen=True)
class Case:
    """One row: the role, the node's GPU count, and the Ray GPU ids of each actor of the bundle."""

    gpu: float
    per_group: int
    rank_based: bool
    ray_ids: list[list[str]]
    device_per_node: int = 8
    device_type: str = "GPU"


def _each(per_group: int, width: int = 1) -> list[list[str]]:
    return [[str(rank * width + k) for k in range(width)] for rank in range(per_group)]


# The rows of tests/unit/prime/test_gpu_table.py, case A, a bundle spanning the node, and CPU.
CASES = {
    "gpu1-pg1-default": Case(1, 1, False, [["3"]]),
    "gpu2-pg1": Case(2, 1, False, [["2", "5"]]),
    "gpu2-pg4": Case(2, 4, False, _each(4, 2)),
    "gpu1-pg8": Case(1, 8, False, _each(8)),
    "gpu1-pg8-rank-based": Case(1, 8, True, _each(8)),
    "caseB-gpu0.5-pg1": Case(0.5, 1, False, [["1"]]),
    "caseB-gpu0.5-pg8-rank-based": Case(0.5, 8, True, [[str(rank // 2)] for rank in range(8)]),
    "caseA-manual": Case(1, 4, True, [["6"], ["4"], ["7"], ["5"]]),
    "rank-based-spanning-the-node": Case(1, 4, True, _each(4), device_per_node=4),
    "cpu": Case(0, 2, False, [[], []], device_per_node=0, device_type="CPU"),
}


def actor_env(case: Case, local_rank: int) -> tuple[DeviceEnv, dict[str, str]]:
    """What the actor of `local_rank` has in its environment before it starts its rank."""
    spec = spec_from_dict(
        {
            "name": "gpu-env",
            "device_type": case.device_type,
            "device_per_node": case.device_per_node,
            "node_num": 1,
            "roles": [
                {
                    "name": "r",
                    "entrypoint": "m:f",
                    "total": case.per_group,
                    "per_group": case.per_group,
                    "resources": {"gpu": case.gpu},
                    "rank_based_gpu_selection": case.rank_based,
                }
            ],
        }
    )
    found = device_env(spec.role("r"), local_rank, spec.device_type, spec.device_per_node, case.ray_ids)
    env = found.env()
    if found.set_by == "ray":  # Ray sets it from the GPUs it allocated to this actor
        env["CUDA_VISIBLE_DEVICES"] = ",".join(case.ray_ids[local_rank])
    return found, env


@pytest.fixture(scope="module")
def launcher(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TrainingLauncher]:
    """A zygote of this module's own, started with another actor's device view in its environment."""
    directory = Path(f"/tmp/dlu-zg-{os.getpid()}-{time.monotonic_ns() % 10**9}")  # short: a socket path
    directory.mkdir()
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(zygote.DIR_ENV, str(directory))
        for name, value in ZYGOTE_ENV.items():
            patch.setenv(name, value)
        started = TrainingLauncher()
        started.warm_up()
    assert started.preloaded is True
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(zygote.DIR_ENV, str(directory))
        yield started
        started.shutdown(grace_s=1.0)
        zygote.stop_all(directory)


def start_ranks(launcher: TrainingLauncher, case: Case, out: Path) -> dict[int, dict[str, Any]]:
    """Fork every rank of the case's bundle as its actor would; what each recorded."""
    expected: dict[int, tuple[DeviceEnv, Path]] = {}
    procs = []
    for local_rank in range(case.per_group):
        found, env = actor_env(case, local_rank)
        record = out / f"rank-{local_rank}.json"
        with pytest.MonkeyPatch.context() as patch:
            for name in ZYGOTE_ENV:
                patch.delenv(name, raising=False)
            for name, value in env.items():
                patch.setenv(name, value)
            spec = ProcessSpec(
                "gpu_env_script.py",
                env={"RANK": str(local_rank), "LOCAL_RANK": str(local_rank), "GPU_ENV_RECORD": str(record)},
                workdir=str(HERE),
                device=os.environ["DLU_DEVICE"],
            )
            procs.append(launcher.start(spec))
        expected[local_rank] = (found, record)
    codes = [p.wait(60) for p in procs]
    assert codes == [0] * case.per_group, [p.last_failure for p in procs]
    return {rank: json.loads(record.read_text()) for rank, (_, record) in expected.items()}


@pytest.mark.parametrize("name", list(CASES))
def test_rank_sees_its_devices_at_its_first_line(
    launcher: TrainingLauncher, tmp_path: Path, name: str
) -> None:
    case = CASES[name]
    seen = start_ranks(launcher, case, tmp_path)
    for local_rank, record in seen.items():
        found, env = actor_env(case, local_rank)
        where = f"{name}, local rank {local_rank}: {record}"
        assert record["torch_preloaded"] is True, where
        assert record["env"]["LOCAL_RANK"] == str(local_rank), where
        assert record["env"]["DLU_DEVICE"] == found.devices[0], where
        assert record["env"]["DLU_DEVICES"] == ",".join(found.devices), where
        assert record["env"]["CUDA_VISIBLE_DEVICES"] == env.get("CUDA_VISIBLE_DEVICES"), where
        assert record["torch_device"] == record["worker_device"] == found.devices[0], where
        assert record["worker_devices"] == list(found.devices), where
        if found.devices[0].startswith("cuda"):
            visible = record["visible_to_torch"] if "CUDA_VISIBLE_DEVICES" in env else None
            if visible is not None:
                assert visible == env["CUDA_VISIBLE_DEVICES"].split(","), where
            count = len(visible) if visible is not None else case.device_per_node
            assert all(int(d.partition(":")[2] or 0) < count for d in found.devices), where
        assert record["cuda_initialized"] is False and record["bad_fork"] is False, where
