"""What an embedded Ray started on this machine would offer, known without starting it.

`dlu run` starts its own Ray here; a job that needs more CPUs, GPUs or memory than this machine
has can be refused before that costs anything. Each number is an upper bound of what Ray will
find (Ray keeps memory back for its object store, and may count fewer CPUs in a container), so a
job refused on these numbers could never have run; the exact check follows once Ray is up.

Ray's own detection is mirrored where it can only find less: CPU count or cgroup quota, NVIDIA
device files, physical memory; overrides first (`RAY_OVERRIDE_RESOURCES`, then the options given
to the local client). A resource that cannot be bounded (a GPU of another vendor) is left out.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import re
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

RAY_OVERRIDE_ENV = "RAY_OVERRIDE_RESOURCES"  # Ray's: a JSON dict that wins over everything

_NVIDIA_DEVICE = re.compile(r"^nvidia\d+$")


def local_resources(
    ray_options: Mapping[str, Any], env: Mapping[str, str] | None = None, root: Path = Path("/")
) -> dict[str, float]:
    """Upper bounds of the "CPU", "GPU" and "memory" (bytes) an embedded Ray started here with
    `ray_options` would have; empty when the options join an existing Ray instead.

    `env` and `root` (the file system root) are for tests.
    """
    env = os.environ if env is None else env
    if ray_options.get("address") not in (None, "local"):
        return {}
    override = _override(env)
    found: dict[str, float] = {}
    for name, option, detect in (
        ("CPU", "num_cpus", lambda: _cpu_bound(root)),
        ("GPU", "num_gpus", lambda: _gpu_bound(env, root)),
        ("memory", "memory", lambda: _memory_bound(env)),
    ):
        value = override.get(name, ray_options.get(option))
        if value is None:
            value = detect()
        if value is not None:
            found[name] = float(value)
    return found


def resource_override(env: Mapping[str, str] | None = None) -> dict[str, float]:
    """The resources RAY_OVERRIDE_RESOURCES sets (they win over Ray's options)."""
    return _override(os.environ if env is None else env)


def _override(env: Mapping[str, str]) -> dict[str, float]:
    text = env.get(RAY_OVERRIDE_ENV)
    if not text:
        return {}
    try:
        data = json.loads(text)
    except ValueError:
        return {}  # Ray itself refuses to start with it, and says why
    if not isinstance(data, dict):
        return {}
    items: dict[str, Any] = data  # pyright: ignore[reportUnknownVariableType]
    return {str(k): float(v) for k, v in items.items() if isinstance(v, int | float)}


def _read(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError):
        return None


def _cpu_bound(root: Path) -> float:
    """The CPU count, or a larger cgroup quota (Ray takes the quota when there is one)."""
    count = float(os.cpu_count() or 1)
    quota: float | None = None
    v1 = (
        _read(root / "sys/fs/cgroup/cpu/cpu.cfs_quota_us"),
        _read(root / "sys/fs/cgroup/cpu/cpu.cfs_period_us"),
    )
    v2 = _read(root / "sys/fs/cgroup/cpu.max")
    try:
        if v1[0] is not None and v1[1] is not None:
            quota = float(v1[0]) / float(v1[1])
        elif v2 is not None and len(v2.split()) == 2 and v2.split()[0].isdigit():
            quota = float(v2.split()[0]) / float(v2.split()[1])
    except (ValueError, ZeroDivisionError):
        quota = None
    return max(count, float(int(quota))) if quota is not None and quota > 0 else count


def _gpu_bound(env: Mapping[str, str], root: Path) -> float | None:
    """NVIDIA GPUs (device files or the driver's list, within CUDA_VISIBLE_DEVICES); None where
    Ray could find a GPU of another vendor, which cannot be counted without it."""
    if sys.platform == "darwin" or (root / "dev/kfd").exists() or (root / "sys/module/amdgpu").exists():
        return None
    if any(importlib.util.find_spec(m) is not None for m in ("dpctl", "pymxsml")):
        return None  # Intel or MetaX GPUs: Ray counts them through these packages
    devices = {p.name for p in _list(root / "dev") if _NVIDIA_DEVICE.match(p.name)}
    listed = _list(root / "proc/driver/nvidia/gpus")
    count = max(len(devices), len(listed))
    visible = env.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        ids = [] if visible in ("", "NoDevFiles") else visible.split(",")
        count = min(count, len(ids))
    return float(count)


def _list(directory: Path) -> list[Path]:
    try:
        return list(directory.iterdir())
    except OSError:
        return []


def _memory_bound(env: Mapping[str, str]) -> float | None:
    """Physical memory: Ray's memory resource is what is available of it, less its object store.
    None when Ray is told to count swap too."""
    if env.get("RAY_count_swap_in_memory_monitor", "").lower() in ("1", "true"):
        return None
    try:
        return float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return None
