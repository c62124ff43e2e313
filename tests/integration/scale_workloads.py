"""Workloads of the `dlu scale` tests. Importing this module in an actor of rank >= SLOW_FROM
sleeps SLOW_S first: its self check (which imports the entrypoint) is slow, so a resize that adds
such actors is reliably still in flight when the test kills the PrimeMaster."""

from __future__ import annotations

import os
import time

from workloads import forever

SLOW_FROM = int(os.environ.get("SCALE_SLOW_FROM", "1000000"))
if int(os.environ.get("ROLE_RANK", "0")) >= SLOW_FROM:
    time.sleep(float(os.environ.get("SCALE_SLOW_S", "0")))

__all__ = ["forever"]
