"""The reference job of the Ray benchmarks (DESIGN section 9: one elastic role, 2 nodes x 2
processes, CPU, gloo) and the status read they share."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
LM = ROOT / "examples" / "elastic" / "train_lm.py"


def reference_spec(name: str, lm_args: str, **job: Any) -> Any:
    """The reference job named `name`, running train_lm.py with `lm_args` (node check off:
    these benchmarks time failover, not the start); `job` adds top-level spec fields."""
    from dlu_api.spec import spec_from_dict

    return spec_from_dict(
        {
            "name": name,
            "device_type": "CPU",
            "device_per_node": 0,
            "node_num": 2,
            "health": {"monitor_interval_s": 0.1},
            **job,
            "roles": [
                {
                    "name": "trainer",
                    "kind": "elastic",
                    "entrypoint": f"{LM} {lm_args}",
                    "resources": {"cpu": 0.25},
                    "elastic": {"nnodes": 2, "nproc_per_node": 2, "node_check": {"enabled": False}},
                }
            ],
        }
    )


def status(job: str) -> Any:
    """The job's status, or None while its PrimeMaster cannot answer (restarting)."""
    from dlu_prime import launcher

    try:
        return launcher.job_status(job)
    except Exception:
        return None


def wait(
    what: str, check: Any, timeout_s: float = 300.0, every: float = 0.02, clock: Any = time.monotonic
) -> float:
    """`clock()` when `check()` first holds, polling every `every` s; exits the benchmark if it
    does not within `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if check():
            return clock()
        time.sleep(every)
    raise SystemExit(f"timed out waiting for {what}")
