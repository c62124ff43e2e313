"""The reference LM job the failover tests run: 2 nodes x 1 process (CPU, gloo), checkpoints."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from dlu_api.spec import spec_from_dict

LM = Path(__file__).resolve().parents[2] / "examples" / "elastic" / "train_lm.py"


def lm_job(
    name: str,
    ckpt: Path,
    *,
    steps: int = 60,
    step_s: float = 0.2,
    extra_args: str = "",
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
                    "entrypoint": f"{LM} --steps {steps} --step-seconds {step_s} --checkpoint-dir {ckpt} {extra_args}",
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
