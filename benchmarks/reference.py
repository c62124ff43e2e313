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


_masters: dict[str, Any] = {}  # job -> its PrimeMaster's handle (a restarted one keeps it)


def status(job: str) -> Any:
    """The job's status, or None while its PrimeMaster cannot answer (restarting).

    The handle is looked up once per job, not at every look: benchmarks poll this every 20 ms
    while they time a recovery, and each look takes CPU from what they time."""
    import ray

    from dlu_api.status import JobStatus
    from dlu_prime import launcher

    try:
        master = _masters.get(job) or launcher.get_master(job)
        if master is None:
            return None
        _masters[job] = master
        return JobStatus.model_validate(ray.get(master.status.remote(50), timeout=30))
    except Exception:
        _masters.pop(job, None)  # a job of that name created again: look it up afresh
        return None


def fresh_status(job: str, within_s: float = 0.25) -> Any:
    """The job's status from a call sent now, or None when it is not answered within `within_s`.

    For timing a PrimeMaster's restart: a call that was on its way to the killed process is
    failed (or retried) by Ray only after it waited 1 to 2 s for news of the death, however soon
    the new PrimeMaster answers, so a benchmark blocked in it times Ray's wait, not the restart.
    Asking again with a new call every time measures when the new PrimeMaster answers."""
    import ray

    from dlu_api.status import JobStatus
    from dlu_prime import launcher

    try:
        master = launcher.get_master(job)
        if master is None:
            return None
        return JobStatus.model_validate(ray.get(master.status.remote(50), timeout=within_s))
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
