"""On real GPUs (marked `gpu`; each test skips with the reason where too few are visible, found
with `nvidia-smi -L` or /proc/driver/nvidia, never with torch.cuda in this process):

- training processes forked from the zygote each use CUDA on the GPU their environment names,
  which they could not if the zygote had initialised CUDA (a bad fork refuses CUDA);
- benchmarks/gpu_smoke.py: 2 NCCL ranks through `dlu run`, the node check on NCCL, one crash
  and in-place restart;
- benchmarks/gpu_fork_restart.py: ranks forked from the zygote on NCCL crash and are forked again
  (one GPU is enough, no Ray).
"""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

from dlu_elastic.worker.process import ProcessSpec, TrainingLauncher

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
BENCHMARKS = ROOT / "benchmarks"

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def gpu_smoke() -> Iterator[ModuleType]:
    """benchmarks/gpu_smoke.py as a module: how it finds the GPUs and why it would skip."""
    sys.path.insert(0, str(BENCHMARKS))
    try:
        yield importlib.import_module("gpu_smoke")
    finally:
        sys.path.remove(str(BENCHMARKS))


@pytest.mark.timeout(300)
def test_forked_children_use_the_gpu_their_environment_names(gpu_smoke: ModuleType, tmp_path: Path) -> None:
    gpus = gpu_smoke.visible_gpus()[:2]
    if not gpus:
        pytest.skip("no NVIDIA GPU visible (nvidia-smi -L, /proc/driver/nvidia/gpus)")
    launcher = TrainingLauncher()
    launcher.warm_up()
    procs = []
    for gpu in gpus:
        # By UUID where known: CUDA's own device order need not be nvidia-smi's.
        visible = {"CUDA_VISIBLE_DEVICES": gpu.uuid} if gpu.uuid else {"CUDA_VISIBLE_DEVICES": str(gpu.index)}
        if not gpu.uuid:
            visible["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
        env = {**visible, "GPU_ENV_USE_CUDA": "1", "GPU_ENV_RECORD": str(tmp_path / f"gpu-{gpu.index}.json")}
        spec = ProcessSpec("gpu_env_script.py", env=env, workdir=str(HERE), device="cuda:0")
        procs.append(launcher.start(spec))
    assert [p.wait(120) for p in procs] == [0] * len(gpus), [p.last_failure for p in procs]
    for gpu in gpus:
        record = json.loads((tmp_path / f"gpu-{gpu.index}.json").read_text())
        assert record["bad_fork"] is False and record["cuda_initialized"] is False, record
        assert record["cuda"]["device_count"] == 1, record
        assert record["cuda"]["matmul_sum"] == 256.0 * 256 * 256, record
        if gpu.uuid:
            seen = record["cuda"]["uuid"].lower().removeprefix("gpu-")
            assert seen == gpu.uuid.lower().removeprefix("gpu-"), record


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_gpu_smoke_through_dlu_run(gpu_smoke: ModuleType) -> None:
    reason = gpu_smoke.skip_reason(gpu_smoke.visible_gpus())
    if reason is not None:
        pytest.skip(reason)
    done = subprocess.run(
        [sys.executable, str(BENCHMARKS / "gpu_smoke.py")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=560,
    )
    output = (done.stdout + done.stderr)[-6000:]
    assert done.returncode == 0, output
    assert "PASSED" in done.stdout, output


@pytest.mark.timeout(400)
def test_gpu_ranks_crash_and_fork_again_from_the_zygote_on_nccl(gpu_smoke: ModuleType) -> None:
    """benchmarks/gpu_fork_restart.py: one GPU is enough, and no Ray is needed."""
    if not gpu_smoke.visible_gpus():
        pytest.skip("no NVIDIA GPU visible (nvidia-smi -L, /proc/driver/nvidia/gpus)")
    done = subprocess.run(
        [sys.executable, str(BENCHMARKS / "gpu_fork_restart.py"), "--restarts", "2"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=360,
    )
    output = (done.stdout + done.stderr)[-6000:]
    assert done.returncode == 0, output
    assert "PASSED" in done.stdout, output
