"""Nothing that forks may have touched CUDA: the torch zygote's preload, the node-check probe a
child of it runs on CPU, and the Ray zygote's preload, each run under a profiler hook that
records every call into CUDA, NVML or AMD SMI (tests/integration/cuda_watch.py). No GPU is
needed: the calls happen, and fail quietly, without one (on an H200 the same checks pass, and
children forked after the preload use CUDA: tests/integration/test_gpu.py). A control case (device_count) proves
the hook sees such a call."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

HERE = Path(__file__).resolve().parent
WATCH = HERE / "cuda_watch.py"

pytestmark = [pytest.mark.slow, pytest.mark.timeout(400)]


def watch(*phases: str) -> dict[str, Any]:
    """Run `cuda_watch.py PHASES` in a fresh interpreter; its report."""
    env = {k: v for k, v in os.environ.items() if k != "PYTORCH_NVML_BASED_CUDA_CHECK"}
    done = subprocess.run(
        [sys.executable, str(WATCH), *phases],
        cwd=HERE,
        env=env,
        capture_output=True,
        text=True,
        timeout=360,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    lines = done.stdout.strip().splitlines()
    assert lines, f"cuda_watch printed nothing; stderr:\n{done.stderr[-4000:]}"
    return json.loads(lines[-1])


def beyond_torch_import(watched: dict[str, Any], info: dict[str, Any]) -> list[str]:
    """The driver libraries a phase mapped beyond what a bare `import torch` maps (on CUDA 13,
    libcuda itself: cuBLASLt dlopens it at load, without initialising CUDA)."""
    return sorted(set(info["driver_mapped"]) - set(watched["torch_import"]["driver_mapped"]))


@pytest.fixture(scope="module")
def torch_paths() -> dict[str, Any]:
    """One interpreter: the zygote's preload, the probe a child of it runs, then the control."""
    return watch("zygote", "node_check", "control")


def test_zygote_preload_calls_no_cuda(torch_paths: dict[str, Any]) -> None:
    report = torch_paths["zygote"]
    info = report["info"]
    assert info["loaded"] == info["preload"] and not info["failed"], (
        "the preload did not run: nothing checked"
    )
    assert "torch" in info["loaded"]
    assert report["calls"] == [], "the zygote's preload called into CUDA:\n" + "\n".join(report["calls"])
    assert info["child_in_bad_fork"] is False, "torch marks the zygote's children as bad forks"
    assert beyond_torch_import(torch_paths, info) == [], "the zygote loaded the GPU driver"


def test_node_check_probe_on_cpu_calls_no_cuda(torch_paths: dict[str, Any]) -> None:
    report = torch_paths["node_check"]
    metrics = report["info"]["metrics"]
    assert len(metrics) == 1 and metrics[0] > 0, f"the probe did not run to its heartbeat: {metrics}"
    assert report["calls"] == [], "the node check on CPU called into CUDA:\n" + "\n".join(report["calls"])
    assert report["info"]["child_in_bad_fork"] is False
    assert beyond_torch_import(torch_paths, report["info"]) == [], (
        "the node check on CPU loaded the GPU driver"
    )


def test_ray_worker_zygote_preload_calls_no_cuda() -> None:
    watched = watch("ray_workers")
    report = watched["ray_workers"]
    info = report["info"]
    assert info["loaded"] == info["preload"] and not info["failed"], (
        "the preload did not run: nothing checked"
    )
    assert report["calls"] == [], "the Ray zygote's preload called into CUDA:\n" + "\n".join(report["calls"])
    assert beyond_torch_import(watched, info) == [], "the Ray zygote loaded the GPU driver"


def test_the_hook_catches_a_cuda_call(torch_paths: dict[str, Any]) -> None:
    """The control: `torch.cuda.device_count()` and `is_available()` in the same harness must be
    seen, down to the runtime call, and must make a later fork bad; otherwise the clean results
    above prove nothing."""
    report = torch_paths["control"]
    calls = report["calls"]
    for entry in ("torch.cuda.device_count ", "torch.cuda.is_available ", "torch._C._cuda_getDeviceCount "):
        assert any(call.startswith(entry) for call in calls), f"{entry.strip()} not seen in {calls}"
    assert report["info"]["child_in_bad_fork"] is True
    if Path("/proc/driver/nvidia").exists():  # a driver to load: the control loads it
        assert any("libcuda.so" in path for path in report["info"]["driver_mapped"]), report["info"]
