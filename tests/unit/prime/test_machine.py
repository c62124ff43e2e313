"""What an embedded Ray here would offer at most, read without Ray (`dlu_prime.machine`), on a
fake file system root: overrides first, then NVIDIA device files, cgroup quotas, memory."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from dlu_prime.machine import local_resources

pytestmark = pytest.mark.timeout(30)


def touch(root: Path, *paths: str, text: str = "") -> None:
    for path in paths:
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_text(text)


def test_an_empty_machine_has_its_cpus_no_gpu_and_its_memory(tmp_path: Path) -> None:
    found = local_resources({}, env={}, root=tmp_path)
    assert found["CPU"] == float(os.cpu_count() or 1)
    assert found["GPU"] == 0.0
    assert found["memory"] == float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))


def test_nvidia_gpus_are_counted_within_cuda_visible_devices(tmp_path: Path) -> None:
    touch(tmp_path, "dev/nvidia0", "dev/nvidia1", "dev/nvidiactl", "dev/nvidia-uvm")
    assert local_resources({}, env={}, root=tmp_path)["GPU"] == 2.0
    assert local_resources({}, env={"CUDA_VISIBLE_DEVICES": "1"}, root=tmp_path)["GPU"] == 1.0
    assert local_resources({}, env={"CUDA_VISIBLE_DEVICES": ""}, root=tmp_path)["GPU"] == 0.0
    touch(tmp_path, "proc/driver/nvidia/gpus/0000:01:00.0/information")
    touch(tmp_path, "proc/driver/nvidia/gpus/0000:02:00.0/information")
    touch(tmp_path, "proc/driver/nvidia/gpus/0000:03:00.0/information")
    assert local_resources({}, env={}, root=tmp_path)["GPU"] == 3.0  # the driver's list: more


def test_a_gpu_of_another_vendor_is_not_bounded(tmp_path: Path) -> None:
    touch(tmp_path, "dev/kfd")  # ROCm: Ray counts AMD GPUs through its own library
    assert "GPU" not in local_resources({}, env={}, root=tmp_path)


def test_ray_override_then_client_options_win_over_detection(tmp_path: Path) -> None:
    options = {"num_cpus": 3, "num_gpus": 2, "memory": 2**30}
    assert local_resources(options, env={}, root=tmp_path) == {"CPU": 3.0, "GPU": 2.0, "memory": 2.0**30}
    env = {"RAY_OVERRIDE_RESOURCES": '{"CPU": 7, "GPU": 1}'}
    found = local_resources(options, env=env, root=tmp_path)
    assert (found["CPU"], found["GPU"], found["memory"]) == (7.0, 1.0, 2.0**30)
    assert local_resources({}, env={"RAY_OVERRIDE_RESOURCES": "not json"}, root=tmp_path)["GPU"] == 0.0


def test_a_cgroup_quota_above_the_cpu_count_is_the_bound(tmp_path: Path) -> None:
    count = float(os.cpu_count() or 1)
    touch(tmp_path, "sys/fs/cgroup/cpu.max", text=f"{int(count + 3) * 100000} 100000\n")
    assert local_resources({}, env={}, root=tmp_path)["CPU"] == count + 3
    touch(tmp_path, "sys/fs/cgroup/cpu.max", text="max 100000\n")
    assert local_resources({}, env={}, root=tmp_path)["CPU"] == count
    touch(tmp_path, "sys/fs/cgroup/cpu.max", text="50000 100000\n")  # half a CPU: Ray finds fewer
    assert local_resources({}, env={}, root=tmp_path)["CPU"] == count


def test_memory_is_not_bounded_when_ray_counts_swap(tmp_path: Path) -> None:
    found = local_resources({}, env={"RAY_count_swap_in_memory_monitor": "1"}, root=tmp_path)
    assert "memory" not in found


def test_joining_an_existing_ray_bounds_nothing(tmp_path: Path) -> None:
    assert local_resources({"address": "auto"}, env={}, root=tmp_path) == {}
    assert local_resources({"address": "local"}, env={}, root=tmp_path) != {}
