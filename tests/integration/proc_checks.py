"""Process checks shared by the training-process and zygote tests."""

from __future__ import annotations

import os
from pathlib import Path


def gone(pid: int) -> bool:
    """Whether `pid` has exited (a zombie still answers kill(0): its state is read)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z"
    except OSError:
        return True
