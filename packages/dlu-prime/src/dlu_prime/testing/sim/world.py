"""The simulated job: an elastic role with a MIN:MAX node range (it has a SubMaster, shrinks
on a lost node and grows back) and a resizable simple role; limits drawn per seed, small
enough that some seeds reach them."""

from __future__ import annotations

import random

from dlu_api.spec import spec_from_dict
from dlu_api.spec.models import JobSpec

JOB = "sim"
ELASTIC = "train"
SIMPLE = "data"


AUTOSCALE = {"mode": "single-job", "settle_s": 2.0, "measure_s": 3.0}
"""What `autoscale=True` adds: decisions every few steps, among the faults."""


def sim_spec(
    rng: random.Random, nodes: int = 3, ranks_per_node: int = 2, data: int = 2, autoscale: bool = False
) -> JobSpec:
    max_restart = rng.randint(2, 8)
    extra = {"autoscale": AUTOSCALE} if autoscale else {}
    return spec_from_dict(
        {
            **extra,
            "name": JOB,
            "device_type": "CPU",
            "device_per_node": 0,
            "roles": [
                {
                    "name": ELASTIC,
                    "kind": "elastic",
                    "entrypoint": "pkg.train:main",
                    "resizable": True,
                    "max_restart": max_restart,
                    "escalate_after": rng.randint(2, 4),
                    "elastic": {
                        "nnodes": f"1:{nodes}",
                        "nproc_per_node": ranks_per_node,
                        "node_check": {"enabled": False},
                        "replace_timeout_s": 10.0,
                        "resize_interval_s": 5.0,
                    },
                },
                {
                    "name": SIMPLE,
                    "entrypoint": "pkg.data:main",
                    "total": data,
                    "resizable": True,
                    "is_driver": False,
                    "recovery": rng.choice(("in_place", "in_place", "global")),
                    "max_restart": max_restart,
                },
            ],
            "limits": {
                "job_max_restart": rng.randint(1, 4),
                "master_max_restart": rng.randint(2, 8),
                "global_restart_budget": rng.randint(1, 4),
            },
            "health": {"monitor_interval_s": 1.0},
        }
    )
