"""A torchrun script whose rank 1 raises: what a failing job prints in `dlu run`."""

import os
import time

print("rank", os.environ["RANK"], "up", flush=True)
time.sleep(0.5)
if os.environ["RANK"] == "1":
    raise RuntimeError("boom from failing_script")
time.sleep(30)
