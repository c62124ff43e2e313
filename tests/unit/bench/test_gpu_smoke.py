"""benchmarks/gpu_smoke.py without a GPU: how it finds GPUs (a stand-in `nvidia-smi` on PATH),
when it skips, and that its verdict on a run folder names every way a run fell short."""

from __future__ import annotations

import importlib
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

pytestmark = pytest.mark.timeout(60)

BENCHMARKS = Path(__file__).resolve().parents[3] / "benchmarks"
UUIDS = ("GPU-aaaaaaaa-1111-2222-3333-444444444444", "GPU-bbbbbbbb-1111-2222-3333-444444444444")
LISTING = f"""GPU 0: NVIDIA H100 80GB HBM3 (UUID: {UUIDS[0]})
GPU 1: NVIDIA H100 80GB HBM3 (UUID: {UUIDS[1]})
  MIG 1g.10gb     Device  0: (UUID: MIG-cccccccc-1111-2222-3333-444444444444)
"""


@pytest.fixture
def smoke() -> Iterator[ModuleType]:
    sys.path.insert(0, str(BENCHMARKS))
    try:
        yield importlib.import_module("gpu_smoke")
    finally:
        sys.path.remove(str(BENCHMARKS))


@pytest.fixture
def two_gpus(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A stand-in `nvidia-smi` that lists two GPUs (and a MIG device, which is not one)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "nvidia-smi"
    fake.write_text(f"#!/bin/sh\ncat <<'EOF'\n{LISTING}EOF\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)


@pytest.mark.usefixtures("two_gpus")
def test_gpus_come_from_nvidia_smi_narrowed_as_cuda_reads_its_variable(smoke: ModuleType) -> None:
    every = smoke.visible_gpus()
    assert [(g.index, g.uuid) for g in every] == [(0, UUIDS[0]), (1, UUIDS[1])]
    assert smoke.skip_reason(every) is None
    cases = {"1": [1], UUIDS[1][:12]: [1], "1,0": [1, 0], "0,0": [0], "0,7,1": [0], "-1": [], "": []}
    for setting, indices in cases.items():
        narrowed = smoke.visible_gpus({"CUDA_VISIBLE_DEVICES": setting})
        assert [g.index for g in narrowed] == indices, setting


def test_without_two_gpus_it_skips_and_says_why(
    smoke: ModuleType, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(smoke, "_node_gpus", lambda: [smoke.Gpu(0, "H100", UUIDS[0])])
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    reason = smoke.skip_reason(smoke.visible_gpus())
    assert reason is not None and "needs 2 NVIDIA GPUs" in reason and "1 visible" in reason
    assert "CUDA_VISIBLE_DEVICES='0'" in reason
    assert smoke.main() == 0
    assert capsys.readouterr().out.startswith("SKIPPED: the GPU smoke needs 2 NVIDIA GPUs")


def _passing_run(smoke: ModuleType, folder: Path) -> tuple[Any, list[Any]]:
    """The folder a good run leaves: job record, NCCL INIT logs, start and done records."""
    gpus = [smoke.Gpu(i, "H100", uuid) for i, uuid in enumerate(UUIDS)]
    (folder / "home" / "jobs").mkdir(parents=True)
    events = [{"kind": k} for k in ("node_check", "inplace_restart", "failover_done")]
    status = {"stage": "STOPPED", "exit_code": 0, "roles": [{"inplace_restart_count": 1}], "events": events}
    (folder / "home" / "jobs" / "gpu-smoke.json").write_text(json.dumps({"status": status}))
    (folder / "nccl").mkdir()
    line = "host:1:2 [0] NCCL INFO ncclCommInitRankConfig comm 0x1 rank {r} nranks {n} cudaDev 0 busId 1000 commId 0x2 - Init COMPLETE\n"
    (folder / "nccl" / "nccl.host.1.log").write_text(line.format(r=0, n=1))
    for pid in range(2, 6):
        (folder / "nccl" / f"nccl.host.{pid}.log").write_text(line.format(r=pid % 2, n=2))
    out = folder / "out"
    out.mkdir()
    (out / "crashed").write_text("rank 1 step 3\n")
    for attempt in range(2):
        for rank in range(2):
            start = {
                "env": {"CUDA_VISIBLE_DEVICES": str(rank), "LOCAL_RANK": str(rank), "DLU_DEVICE": "cuda:0"},
                "bad_fork_at_start": False,
                "cuda_initialized_at_start": False,
                "device": "cuda:0",
                "device_count": 1,
                "gpu_uuid": UUIDS[rank].removeprefix("GPU-"),
            }
            (out / f"start-rank{rank}-attempt{attempt}.json").write_text(json.dumps(start))
    for rank in range(2):
        done = {"backend": "nccl", "world_size": 2, "sums": [3.0] * smoke.STEPS}
        (out / f"done-rank{rank}-attempt1.json").write_text(json.dumps(done))
    return smoke.Run(code=0, seconds=30.0), gpus


def _edit(path: Path, change: Any) -> None:
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data))


JOB = Path("home/jobs/gpu-smoke.json")
# What each breakage does to a good run's folder, keyed by words the verdict must then say.
BREAKAGES: dict[str, Any] = {
    "in-place restart": lambda f: _edit(
        f / JOB, lambda d: d["status"]["roles"][0].update(inplace_restart_count=2)
    ),
    "node check": lambda f: _edit(f / JOB, lambda d: d["status"]["events"].append({"kind": "faulty_node"})),
    "one-rank NCCL": lambda f: (f / "nccl" / "nccl.host.1.log").unlink(),
    "touched before": lambda f: _edit(
        f / "out/start-rank1-attempt1.json", lambda d: d.update(bad_fork_at_start=True)
    ),
    "exactly one GPU": lambda f: _edit(
        f / "out/start-rank0-attempt0.json", lambda d: d.update(device_count=2)
    ),
    "two ranks on one GPU": lambda f: _edit(
        f / "out/start-rank1-attempt0.json", lambda d: d.update(gpu_uuid=UUIDS[0].removeprefix("GPU-"))
    ),
    "did not finish": lambda f: (f / "out/done-rank0-attempt1.json").unlink(),
    "crash did not happen": lambda f: (f / "out/crashed").unlink(),
}


def test_the_verdict_passes_a_good_run(smoke: ModuleType, tmp_path: Path) -> None:
    run, gpus = _passing_run(smoke, tmp_path)
    assert smoke.check(run, tmp_path, gpus) == []
    run.code = 1
    assert smoke.check(run, tmp_path, gpus)[0].startswith("dlu run exited 1")


@pytest.mark.parametrize("expected", list(BREAKAGES))
def test_the_verdict_names_each_shortfall(smoke: ModuleType, tmp_path: Path, expected: str) -> None:
    run, gpus = _passing_run(smoke, tmp_path)
    BREAKAGES[expected](tmp_path)
    problems = smoke.check(run, tmp_path, gpus)
    assert any(expected in problem for problem in problems), problems
