"""The jobs of the chaos campaign: the reference elastic job (2 nodes x 2 processes, the
character-level LM, 0.1 s steps, checkpoints every 5 steps) with a simple role beside it; the
pipeline job; and the Ray cluster they run on.

Restart budgets are lifted so that only the campaign's own limit case reaches one, and the
health timeouts are short so that a hung process is found in seconds.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
LM = ROOT / "examples" / "elastic" / "train_lm.py"
WORKDIR = str(HERE)  # the roles' entrypoints are `chaos_roles:<name>`
ROLE = "trainer"
UNLIMITED = 100_000
HEAD_RESOURCE = "chaos_head"  # only the head node: PrimeMaster, ElasticMaster, the simple role
TRAINER_RESOURCE = "chaos_trainer"  # only the trainer's nodes (the ones a node removal hits)
# Each actor setup sleeps this long (dlu_elastic's fault knob), so that a role failover is
# still in flight when the campaign kills the PrimeMaster in it.
SETUP_DELAY_ENV = "DLU_FAULT_SETUP_DELAY_S"
NODE_CHECK_ENV = {
    "delay": "DLU_NODE_CHECK_DELAY_S",
    "counter": "DLU_NODE_CHECK_FAULT_COUNTER",
    "times": "DLU_NODE_CHECK_FAULT_TIMES",
}


@dataclass(frozen=True)
class Training:
    """One run of the reference elastic job. `cluster`: actors placed by the custom resources of
    `start_cluster` (masters and the simple role on the head, ranks on the trainer nodes, one
    node per group of ranks); otherwise anywhere on a one-node Ray."""

    name: str
    steps: int
    out: Path  # checkpoints in out/ckpt, pid logs in out/pids
    step_s: float = 0.1
    nnodes: int = 2
    nproc: int = 2
    checkpoint_every: int = 5
    heartbeat_timeout_s: float = 5.0
    hang_timeout_s: float | None = None
    max_restart: int = UNLIMITED
    setup_delay_s: float = 0.0
    node_check_delay_s: float = 0.0  # > 0: the node check runs, its first probes this slow
    sidecar: bool = True
    cluster: bool = False
    open_ended: bool = False  # the campaign picks the last step while it runs (stop_file)
    extra_env: dict[str, str] = field(default_factory=dict[str, str])

    @property
    def ranks(self) -> int:
        return self.nnodes * self.nproc

    @property
    def ckpt(self) -> Path:
        return self.out / "ckpt"

    @property
    def pid_dir(self) -> Path:
        return self.out / "pids"

    @property
    def stop_file(self) -> Path:
        return self.out / "stop-at-step"

    @property
    def node_check_counter(self) -> Path:
        return self.out / "node-check-probes"

    def final_loss(self) -> str | None:
        path = self.ckpt / "final_loss.txt"
        return path.read_text().strip() if path.exists() else None

    def spec(self) -> Any:
        from dlu_api.spec import spec_from_dict

        self.ckpt.mkdir(parents=True, exist_ok=True)
        self.pid_dir.mkdir(parents=True, exist_ok=True)
        args = (
            f"--steps {self.steps} --step-seconds {self.step_s} --checkpoint-every {self.checkpoint_every} "
            f"--checkpoint-dir {self.ckpt} --pid-dir {self.pid_dir}"
        )
        if self.open_ended:
            args += f" --stop-file {self.stop_file}"
        env = dict(self.extra_env)
        if self.setup_delay_s > 0:
            env[SETUP_DELAY_ENV] = str(self.setup_delay_s)
        node_check: dict[str, Any] = {"enabled": False}
        if self.node_check_delay_s > 0:
            node_check = {"matmul_size": 128, "allreduce_mb": 1, "timeout_s": 60}
            env[NODE_CHECK_ENV["delay"]] = str(self.node_check_delay_s)
            env[NODE_CHECK_ENV["counter"]] = str(self.node_check_counter)
            env[NODE_CHECK_ENV["times"]] = str(self.nnodes)  # the first round's probes only
        trainer: dict[str, Any] = {
            "name": ROLE,
            "kind": "elastic",
            "entrypoint": f"{LM} {args}",
            "resources": {"cpu": 0.25, **_custom(self.cluster, TRAINER_RESOURCE)},
            "env": env,
            **_unlimited(self.max_restart),
            "elastic": {"nnodes": self.nnodes, "nproc_per_node": self.nproc, "node_check": node_check},
        }
        roles = [trainer]
        if self.sidecar:
            roles.append(
                {
                    "name": "sidecar",
                    "entrypoint": "chaos_roles:sidecar",
                    "resources": {"cpu": 0.05, **_custom(self.cluster, HEAD_RESOURCE)},
                    "is_driver": False,
                    "recovery": "in_place",
                    **_unlimited(UNLIMITED),
                }
            )
        return spec_from_dict(
            {
                "name": self.name,
                "device_type": "CPU",
                "device_per_node": 0,
                "node_num": self.nnodes,
                "placement_strategy": "STRICT_SPREAD" if self.cluster else "PACK",
                "master": {"cpu": 0.1, "isolation_resource": HEAD_RESOURCE if self.cluster else None},
                "health": _health(self.heartbeat_timeout_s, self.hang_timeout_s),
                "limits": _limits(),
                "roles": roles,
            }
        )


@dataclass(frozen=True)
class Pipeline:
    """The pipeline job: one producer, `consumers` consumers, `records` records at one per
    `interval_s`; every id received is logged under `out`."""

    name: str
    records: int
    out: Path
    interval_s: float = 0.05
    consumers: int = 2
    heartbeat_timeout_s: float = 5.0

    def spec(self) -> Any:
        from dlu_api.spec import spec_from_dict

        self.out.mkdir(parents=True, exist_ok=True)
        common = {"resources": {"cpu": 0.1}, "recovery": "in_place", **_unlimited(UNLIMITED)}
        return spec_from_dict(
            {
                "name": self.name,
                "device_type": "CPU",
                "device_per_node": 0,
                "master": {"cpu": 0.1},
                "config": {"records": self.records, "interval_s": self.interval_s, "out_dir": str(self.out)},
                "health": _health(self.heartbeat_timeout_s, None),
                "limits": _limits(),
                "roles": [
                    {"name": "source", "entrypoint": "chaos_roles:pipe_source", **common},
                    {
                        "name": "sink",
                        "entrypoint": "chaos_roles:pipe_sink",
                        "total": self.consumers,
                        **common,
                    },
                ],
            }
        )


def steps_for(duration_s: float, step_s: float) -> int:
    """Training steps that take at least `duration_s` at `step_s` each (faults only add time)."""
    return max(20, math.ceil(duration_s / step_s))


def _custom(cluster: bool, resource: str) -> dict[str, Any]:
    return {"custom": {resource: 0.001}} if cluster else {}


def _unlimited(max_restart: int) -> dict[str, Any]:
    return {"max_restart": max_restart, "escalate_after": UNLIMITED, "per_node_max_failure": UNLIMITED}


def _health(heartbeat_timeout_s: float, hang_timeout_s: float | None) -> dict[str, Any]:
    return {
        "monitor_interval_s": 0.2,
        "heartbeat_interval_s": min(1.0, heartbeat_timeout_s / 3),
        "heartbeat_timeout_s": heartbeat_timeout_s,
        "hang_timeout_s": hang_timeout_s,
    }


def _limits() -> dict[str, int]:
    return {
        "job_max_restart": UNLIMITED,
        "node_max_restart": UNLIMITED,
        "master_max_restart": UNLIMITED,
        "global_restart_budget": UNLIMITED,
    }


WORKER_NODE_ARGS: dict[str, Any] = {
    "num_cpus": 2,
    "resources": {TRAINER_RESOURCE: 1},
    "node_ip_address": "127.0.0.1",
}


def start_cluster(trainer_nodes: int = 2) -> Any:
    """A `ray.cluster_utils.Cluster` on loopback: a head (masters, simple role, the pipeline) and
    `trainer_nodes` nodes for the ranks; Ray notices a dead node within a few seconds. Connects
    this process to it and returns the Cluster (its nodes can be removed and added)."""
    import ray
    from ray.cluster_utils import Cluster

    from dlu_prime.naming import NAMESPACE
    from dlu_prime.ray_env import pin_loopback, quiet_ray_env

    quiet_ray_env()
    with pin_loopback():  # the nodes and this driver stay on 127.0.0.1
        cluster = Cluster(
            initialize_head=True,
            head_node_args={
                "num_cpus": 4,
                "resources": {HEAD_RESOURCE: 1},
                "include_dashboard": False,
                "node_ip_address": "127.0.0.1",
                "_system_config": {
                    "health_check_initial_delay_ms": 1000,
                    "health_check_period_ms": 1000,
                    "health_check_timeout_ms": 1000,
                    "health_check_failure_threshold": 3,
                },
            },
        )
        for _ in range(trainer_nodes):
            cluster.add_node(**WORKER_NODE_ARGS)
        cluster.wait_for_nodes()
        ray.init(address=cluster.address, namespace=NAMESPACE, log_to_driver=False)
    return cluster
