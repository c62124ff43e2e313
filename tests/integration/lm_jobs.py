"""The reference LM job the failover tests run (2 nodes x 1 process, CPU, gloo, checkpoints),
and the status reads and waits they share."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from dlu_api.spec import spec_from_dict
from dlu_api.status import JobStatus

LM = Path(__file__).resolve().parents[2] / "examples" / "elastic" / "train_lm.py"


def lm_job(
    name: str,
    ckpt: Path,
    *,
    steps: int = 60,
    step_s: float = 0.2,
    extra_args: str = "",
    script: Path = LM,
    role: dict[str, Any] | None = None,
    elastic: dict[str, Any] | None = None,
    **job: Any,
) -> Any:
    """`step_s` paces the steps (it changes no loss) so faults land while training runs; `role`,
    `elastic` and `job` add fields to the role, its elastic settings and the spec."""
    return spec_from_dict(
        {
            "name": name,
            "device_type": "CPU",
            "device_per_node": 0,
            "node_num": 2,
            "health": {"monitor_interval_s": 0.2},
            **job,
            "roles": [
                {
                    "name": "trainer",
                    "kind": "elastic",
                    "entrypoint": f"{script} --steps {steps} --step-seconds {step_s} --checkpoint-dir {ckpt} {extra_args}",
                    "resources": {"cpu": 0.25},
                    "elastic": {
                        "nnodes": 2,
                        "nproc_per_node": 1,
                        "node_check": {"enabled": False},
                        **(elastic or {}),
                    },
                    **(role or {}),
                }
            ],
        }
    )


def status_of(name: str) -> JobStatus | None:
    """The job's status with its whole timeline; None while its PrimeMaster restarts."""
    from dlu_prime import launcher
    from dlu_prime.master.state import MAX_EVENTS

    try:
        return launcher.job_status(name, events=MAX_EVENTS)
    except Exception:
        return None


def wait_until(
    what: str, check: Callable[[], bool], timeout_s: float = 180.0, interval_s: float = 0.1
) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(interval_s)
    raise AssertionError(f"timed out waiting for {what}")
