"""Whether this machine shows a GPU, cheaply (device files only: no driver or torch import),
to pick the device type a local torchrun command defaults to."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path

_NVIDIA_DEVICE = re.compile(r"^nvidia\d+$")


def gpu_visible(env: Mapping[str, str] | None = None, root: Path = Path("/")) -> bool:
    """An NVIDIA or AMD device file exists and CUDA_VISIBLE_DEVICES does not hide them all.

    `env` and `root` (the file system root) are for tests."""
    env = os.environ if env is None else env
    if env.get("CUDA_VISIBLE_DEVICES", "x").strip() in ("", "-1", "NoDevFiles"):
        return False
    try:
        names = [p.name for p in (root / "dev").iterdir()]
    except OSError:
        return False
    return any(_NVIDIA_DEVICE.match(n) for n in names) or "kfd" in names


def default_device_type(address: str | None) -> str:
    """GPU on a cluster (its nodes, not this machine, run the job) or where a GPU is visible;
    CPU for a local run on a machine without one, so the README's torchrun example runs there."""
    return "GPU" if address or gpu_visible() else "CPU"
