"""A workload whose import (an actor's setup) takes `SLOW_SETUP_S` seconds: a resize that adds
such an actor stays in flight that long, so a test can look at the job meanwhile."""

from __future__ import annotations

import os
import time

from workloads import forever

time.sleep(float(os.environ.get("SLOW_SETUP_S", "0")))

__all__ = ["forever"]
