"""Fault-free soak (DESIGN section 9): the reference elastic job runs for 20 heartbeat timeouts
with nothing injected, and DLU must judge nothing unhealthy.

The job is the reference one (2 nodes x 2 processes, char-level LM, 0.1 s steps) with the node
check on, plus a simple role that never beats (a service) and one that does. The health
settings keep the defaults' ratio of timeout to interval (6 s / 0.25 s by default; here
`--timeout` / (`--timeout` / 24)), so 20 timeouts take 20 x `--timeout` seconds of training.

Prints the alarms seen (any event that means DLU judged something unhealthy or recovered from
it), the restarts by tier, and the final loss against the same training run unpaced with the
defaults, then its FIGURE lines. Usage: `uv run python benchmarks/soak.py [--timeout 6]
[--timeouts 20]`.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from figures import compile_workspace, figure
from reference import LM, ROOT

STEP_S = 0.1
RATIO = 24  # the defaults' heartbeat timeout / interval (6 s / 0.25 s)

# Every event kind that means DLU judged something unhealthy or recovered from it.
ALARMS = frozenset(
    {
        "heartbeat_timeout",
        "hang",
        "unavailable",
        "died",
        "restarted",
        "failed",
        "error_report",
        "inplace_restart",
        "joined_recovery",
        "failover_started",
        "failover_escalated",
        "master_restarted",
        "node_relaunch",
    }
)


def soak_spec(
    name: str, ckpt: Path, steps: int, health: dict[str, float] | None, step_s: float, nproc: int = 2
) -> Any:
    """The soak job (shared with tests/integration/test_long_run.py); `health` None keeps the
    defaults."""
    from dlu_api.spec import spec_from_dict

    return spec_from_dict(
        {
            "name": name,
            "device_type": "CPU",
            "device_per_node": 0,
            "node_num": 2,
            **({"health": health} if health is not None else {}),
            "roles": [
                {
                    "name": "trainer",
                    "kind": "elastic",
                    "entrypoint": f"{LM} --steps {steps} --step-seconds {step_s} --checkpoint-dir {ckpt}",
                    "resources": {"cpu": 0.25},
                    "elastic": {
                        "nnodes": 2,
                        "nproc_per_node": nproc,
                        "node_check": {"matmul_size": 64, "allreduce_mb": 0.5},
                    },
                },
                {"name": "silent", "entrypoint": "workloads:silent_service", "is_driver": False},
                {"name": "beating", "entrypoint": "workloads:forever", "is_driver": False},
            ],
        }
    )


def run(spec: Any) -> Any:
    from dlu_prime import launcher

    launcher.submit_job(spec, str(ROOT / "tests" / "integration"))
    return launcher.wait_job(spec)


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument(
        "--timeout", type=float, default=6.0, help="heartbeat timeout, s (default 6, the default)"
    )
    parser.add_argument("--timeouts", type=int, default=20, help="how many timeouts long (default 20)")
    args = parser.parse_args()
    if args.timeout <= 0 or args.timeouts < 1:
        parser.error("--timeout must be > 0 and --timeouts >= 1")
    compile_workspace()
    from dlu_prime import ray_env

    os.environ.setdefault("RAY_TMPDIR", tempfile.mkdtemp(prefix="dlu-bsoak-", dir="/tmp"))
    ray_env.init_local(num_cpus=8)
    steps = int(args.timeout * args.timeouts / STEP_S)
    health = {
        "heartbeat_interval_s": args.timeout / RATIO,
        "heartbeat_timeout_s": args.timeout,
        "hang_timeout_s": 2 * args.timeout,
    }
    ckpt = Path(tempfile.mkdtemp(prefix="dlu-bsoak-ckpt-"))
    started = time.monotonic()
    final = run(soak_spec("bench-soak", ckpt, steps, health, STEP_S))
    seconds = time.monotonic() - started
    reference_dir = Path(tempfile.mkdtemp(prefix="dlu-bsoak-ref-"))
    reference = run(soak_spec("bench-soak-ref", reference_dir, steps, None, 0.0))
    alarms = [f"{e.kind}: {e.actor or e.role}: {e.message}" for e in final.events if e.kind in ALARMS]
    for line in alarms:
        print(f"alarm: {line}")
    restarts = sum(r.restart_count + r.inplace_restart_count for r in final.roles)
    restarts += final.job_restart_count + final.master_restart_count
    loss = (ckpt / "final_loss.txt").read_text().strip() if (ckpt / "final_loss.txt").exists() else "none"
    ref_loss = (reference_dir / "final_loss.txt").read_text().strip() if reference.exit_code == 0 else "none"
    print(
        f"soak: {steps} steps over {seconds:.1f} s ({seconds / args.timeout:.1f} heartbeat timeouts of "
        f"{args.timeout:g} s); exit {final.exit_code}; {len(alarms)} alarm(s); {restarts} restart(s); "
        f"final loss {loss} vs {ref_loss} unpaced with the defaults"
    )
    figure("soak_alarms", len(alarms), "", 0, f"fault-free soak, {args.timeouts} heartbeat timeouts: alarms")
    figure("soak_restarts", restarts, "", 0, "fault-free soak: restarts of any tier")
    figure(
        "soak_loss_mismatch",
        0 if loss == ref_loss != "none" else 1,
        "",
        0,
        "fault-free soak: loss != reference",
    )
    return 0 if final.exit_code == 0 else 2


if __name__ == "__main__":
    sys.exit(main())
