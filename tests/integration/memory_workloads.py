"""The role of the memory relaunch integration test: its first incarnation holds more than 90%
of its role's `resources.memory` until it is replaced; the next one (relaunched with more)
holds the same, which is no pressure on its new limit, and finishes."""

from __future__ import annotations

import os
import time
from pathlib import Path

from dlu_prime.runtime.context import heartbeat

PAGE = 4096


def hog() -> None:
    marker = Path(os.environ["MEMORY_MARKER"])
    first = not marker.exists()
    marker.write_text("relaunched" if not first else "started")
    held = bytearray(int(os.environ["MEMORY_HOLD_MB"]) * 2**20)
    for at in range(0, len(held), PAGE):  # resident, not only reserved
        held[at] = 1
    deadline = time.monotonic() + (150.0 if first else 6.0)
    step = 0
    while time.monotonic() < deadline:
        step += 1
        heartbeat(step)
        time.sleep(0.5)
    if first:
        raise SystemExit(f"not relaunched with more memory while holding {len(held) >> 20} MiB")
