"""Fluent builders that produce the same `JobSpec` a spec file would.

The builder only gathers values; `build()` hands them to the spec models and the rules, so a
builder and a YAML file can never disagree on defaults or validation.
"""

from __future__ import annotations

import logging
import os
import secrets
from typing import Any, Generic, Self, TypeVar

from dlu_api.spec.io import spec_from_dict
from dlu_api.spec.models import JobSpec, RecoveryPolicy, RoleKind, RoleSpec
from dlu_api.spec.units import parse_memory

B = TypeVar("B", bound="DLJobBuilder")

logger = logging.getLogger(__name__)


class RoleBuilder(Generic[B]):
    """Settings of one role. `end()` returns to the job builder; job-level calls also chain."""

    _kind: RoleKind = RoleKind.SIMPLE

    def __init__(self, parent: B, name: str, entrypoint: str) -> None:
        self._parent = parent
        self._data: dict[str, Any] = {"name": name, "kind": self._kind.value, "entrypoint": entrypoint}

    def total(self, num: int) -> Self:
        self._data["total"] = num
        return self

    def per_group(self, num: int) -> Self:
        self._data["per_group"] = num
        return self

    def resource(
        self,
        cpu: float | None = None,
        memory: int | str | None = None,
        gpu: float | None = None,
        **custom: float,
    ) -> Self:
        """Per-actor resources; memory in bytes or a string such as "4GiB"."""
        resources: dict[str, Any] = self._data.setdefault("resources", {})
        if cpu is not None:
            resources["cpu"] = cpu
        if memory is not None:
            resources["memory"] = parse_memory(memory)
        if gpu is not None:
            resources["gpu"] = gpu
        if custom:
            resources.setdefault("custom", {}).update(custom)
        return self

    def env(self, env: dict[str, str] | None = None, **more: str) -> Self:
        merged: dict[str, str] = self._data.setdefault("env", {})
        merged.update(env or {})
        merged.update(more)
        return self

    def not_driver(self) -> Self:
        """The job does not wait for this role to finish (a service other roles call)."""
        self._data["is_driver"] = False
        return self

    def max_restart(self, num: int) -> Self:
        self._data["max_restart"] = num
        return self

    def per_node_max_failure(self, num: int) -> Self:
        self._data["per_node_max_failure"] = num
        return self

    def rank_based_gpu_selection(self, enabled: bool = True) -> Self:
        self._data["rank_based_gpu_selection"] = enabled
        return self

    def recovery(self, policy: RecoveryPolicy | str, escalate_after: int | None = None) -> Self:
        self._data["recovery"] = RecoveryPolicy(policy).value
        if escalate_after is not None:
            self._data["escalate_after"] = escalate_after
        return self

    def end(self) -> B:
        return self._parent

    def _to_dict(self) -> dict[str, Any]:
        return self._data

    def __getattr__(self, name: str) -> Any:
        """Let job-level calls chain straight after a role (`.role("b").run(...)`)."""
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self._parent, name)


class SimpleRoleBuilder(RoleBuilder[B]):
    _kind = RoleKind.SIMPLE


class CustomRoleBuilder(RoleBuilder[B]):
    _kind = RoleKind.CUSTOM

    def __init__(self, parent: B, name: str, entrypoint: str, sub_master: str) -> None:
        super().__init__(parent, name, entrypoint)
        self._data["sub_master"] = sub_master


class ElasticRoleBuilder(RoleBuilder[B]):
    """torch elastic training; total and per_group follow nnodes x nproc_per_node."""

    _kind = RoleKind.ELASTIC

    def _elastic(self) -> dict[str, Any]:
        return self._data.setdefault("elastic", {})

    def nnodes(self, num: int | str) -> Self:
        """Node count, or an elastic range such as "1:4"."""
        self._elastic()["nnodes"] = str(num)
        return self

    def nproc_per_node(self, num: int) -> Self:
        self._elastic()["nproc_per_node"] = num
        return self

    def comm_backend(self, backend: str) -> Self:
        self._elastic()["comm_backend"] = backend
        return self

    def skip_node_check(self) -> Self:
        self._elastic().setdefault("node_check", {})["enabled"] = False
        return self

    def node_check(self, **settings: Any) -> Self:
        """Node-check thresholds, e.g. `straggler_ratio=3.0, exclude_stragglers=True`."""
        self._elastic().setdefault("node_check", {}).update(settings)
        return self

    def no_setup_process_group(self) -> Self:
        self._elastic()["setup_process_group"] = False
        return self


class DLJobBuilder:
    """Builds a `JobSpec`: job-level settings, then one builder per role."""

    def __init__(self, name: str = "dlu-job") -> None:
        self._job: dict[str, Any] = {"name": name}
        self._roles: list[RoleBuilder[Any]] = []
        self._collocations: list[list[str]] = []
        self._next_role: str | None = None

    # job level
    def name(self, name: str) -> Self:
        self._job["name"] = name
        return self

    def node_num(self, num: int) -> Self:
        self._job["node_num"] = num
        return self

    def device_per_node(self, num: int) -> Self:
        self._job["device_per_node"] = num
        return self

    def device_type(self, device_type: str) -> Self:
        self._job["device_type"] = device_type.upper()
        return self

    def config(self, config: dict[str, Any] | None = None, **more: Any) -> Self:
        merged: dict[str, Any] = self._job.setdefault("config", {})
        merged.update(config or {})
        merged.update(more)
        return self

    def global_env(self, env: dict[str, str] | None = None, **more: str) -> Self:
        merged: dict[str, str] = self._job.setdefault("env", {})
        merged.update(env or {})
        merged.update(more)
        return self

    def state_store(self, name: str, **options: Any) -> Self:
        self._job["state_store"] = {"name": name, "options": options}
        return self

    def limits(self, **limits: int) -> Self:
        """e.g. `limits(job_max_restart=5, global_restart_budget=2)`."""
        self._job.setdefault("limits", {}).update(limits)
        return self

    def health(self, **settings: float | None) -> Self:
        """e.g. `health(heartbeat_timeout_s=60, hang_timeout_s=600)`."""
        self._job.setdefault("health", {}).update(settings)
        return self

    def placement_strategy(self, strategy: str) -> Self:
        self._job["placement_strategy"] = strategy.upper()
        return self

    def master(self, **settings: Any) -> Self:
        """PrimeMaster resources and isolation, e.g. `master(cpu=2, isolation_resource="head")`."""
        if "memory" in settings and settings["memory"] is not None:
            settings["memory"] = parse_memory(settings["memory"])
        self._job.setdefault("master", {}).update(settings)
        return self

    def logs(
        self, dir: str | None = None, redirects: str | int | None = None, tee: str | int | None = None
    ) -> Self:
        """Per-rank log files, as torchrun's --log-dir, --redirects and --tee (see `LogsSettings`)."""
        settings: dict[str, Any] = self._job.setdefault("logs", {})
        for key, value in (("dir", dir), ("redirects", redirects), ("tee", tee)):
            if value is not None:
                settings[key] = value
        return self

    # roles
    def role(self, name: str) -> Self:
        """Name the role that the next `run()` / `train()` / `custom()` defines."""
        self._next_role = name
        return self

    def _take_role_name(self, default: str | None) -> str:
        name = self._next_role or default
        self._next_role = None
        if name is None:
            raise ValueError("call role(name) before run(): every simple role needs a name")
        if any(r._to_dict()["name"] == name for r in self._roles):  # pyright: ignore[reportPrivateUsage]
            raise ValueError(f"role {name!r} is defined twice; give each role a different name")
        return name

    def run(self, entrypoint: str) -> SimpleRoleBuilder[Self]:
        """A simple role: `total` actors each running the entrypoint."""
        builder = SimpleRoleBuilder(self, self._take_role_name(None), entrypoint)
        self._roles.append(builder)
        return builder

    def train(self, entrypoint: str) -> ElasticRoleBuilder[Self]:
        """An elastic torch role (like torchrun); the role is named 'trainer' unless role() said."""
        builder = ElasticRoleBuilder(self, self._take_role_name("trainer"), entrypoint)
        self._roles.append(builder)
        return builder

    def custom(self, entrypoint: str, sub_master: str) -> CustomRoleBuilder[Self]:
        """A role driven by a user SubMaster class ('module:Class')."""
        builder = CustomRoleBuilder(self, self._take_role_name(None), entrypoint, sub_master)
        self._roles.append(builder)
        return builder

    def workload(self, role: str, entrypoint: str) -> SimpleRoleBuilder[Self]:
        """Shorthand for `role(role).run(entrypoint)`."""
        return self.role(role).run(entrypoint)

    def with_collocation(self, *roles: str) -> Self:
        """Place these roles' actors together (same bundles, so same nodes and GPUs)."""
        self._collocations.append(list(roles))
        return self

    def with_collocation_all(self, *exclude_roles: str) -> Self:
        """Collocate every role defined so far, except `exclude_roles`."""
        names = [r._to_dict()["name"] for r in self._roles]  # pyright: ignore[reportPrivateUsage]
        self._collocations.append([n for n in names if n not in exclude_roles])
        return self

    def to_dict(self) -> dict[str, Any]:
        data = dict(self._job)
        data["roles"] = [r._to_dict() for r in self._roles]  # pyright: ignore[reportPrivateUsage]
        if self._collocations:
            data["collocations"] = [{"roles": roles} for roles in self._collocations]
        return data

    def build(self) -> JobSpec:
        """The validated spec.

        Raises:
            SpecError: listing every problem, with the field and the fix.
        """
        return spec_from_dict(self.to_dict())


class RLJobBuilder(DLJobBuilder):
    """Trainer-driven RL: the trainer is the driver; the other roles serve it over RPC."""

    def _service(self, name: str, entrypoint: str) -> SimpleRoleBuilder[Self]:
        return self.role(name).run(entrypoint).not_driver()

    def trainer(self, entrypoint: str) -> SimpleRoleBuilder[Self]:
        return self.role("trainer").run(entrypoint)

    def actor(self, entrypoint: str) -> SimpleRoleBuilder[Self]:
        return self._service("actor", entrypoint)

    def critic(self, entrypoint: str) -> SimpleRoleBuilder[Self]:
        return self._service("critic", entrypoint)

    def rollout(self, entrypoint: str) -> SimpleRoleBuilder[Self]:
        return self._service("rollout", entrypoint)

    def reference(self, entrypoint: str) -> SimpleRoleBuilder[Self]:
        return self._service("reference", entrypoint)

    def reward(self, entrypoint: str) -> SimpleRoleBuilder[Self]:
        return self._service("reward", entrypoint)


def from_torchrun_cmd(
    command: str | list[str],
    *,
    name: str | None = None,
    device_type: str = "GPU",
    device_per_node: int | None = None,
    role: str = "trainer",
) -> JobSpec:
    """A one-role elastic job from a torchrun command line, e.g.
    `from_torchrun_cmd("torchrun --nnodes=2 --nproc-per-node=2 train.py --lr 1e-3")`.

    torchrun has no device flag, so the device type is the caller's (GPU unless told otherwise),
    never guessed from the driver machine. `--log-dir` becomes `logs.dir`; every rank writes both
    streams to its files, and what torchrun would print on its console (everything, unless
    `--redirects` sends a stream to a file only; `--tee` prints it again; only the local ranks
    of `--local-ranks-filter`) becomes `logs.tee`. Without `name` the job is named after the
    script plus a unique suffix, so that two torchrun jobs never share a name. Where DLU differs
    from torchrun on purpose (the restart default), a warning says so.

    Raises:
        ValueError: not a torchrun command, or `--nproc-per-node` cannot be resolved.
        SpecError: the resulting spec breaks a rule.
    """
    from dlu_api.rank_logs import torchrun_tee
    from dlu_api.spec.torchrun import default_job_name, differences, parse_torchrun

    cmd = parse_torchrun(command)
    if cmd.ignored_flags:
        flags = ", ".join(f"--{flag}" for flag in cmd.ignored_flags)
        logger.warning(
            "torchrun flags DLU handles itself (its own rendezvous and monitoring), ignored: %s", flags
        )
    if name is None:
        name = default_job_name(cmd, secrets.token_hex(3))
        logger.warning("job name: %s (--name chooses one)", name)
    for note in differences(cmd, RoleSpec.model_fields["max_restart"].default):
        logger.warning("%s", note)
    dtype = device_type.upper()
    builder = DLJobBuilder(name).device_type(dtype)
    nproc = cmd.nproc_per_node
    if isinstance(nproc, str):
        if dtype == "GPU" and nproc in ("gpu", "auto"):
            nproc = device_per_node or 8
        else:
            raise ValueError(
                f"--nproc-per-node={nproc} depends on the machine the ranks land on; "
                "give a number, e.g. --nproc-per-node=4"
            )
    per_node = device_per_node if device_per_node is not None else (nproc if dtype == "GPU" else 0)
    builder.device_per_node(per_node).node_num(cmd.max_nodes)
    if cmd.log_dir is not None:
        builder.logs(dir=os.path.abspath(os.path.expanduser(cmd.log_dir)))  # as the driver sees it
    # torchrun's console is `dlu run`'s terminal: what torchrun would print there is tee'd (every
    # stream also goes to the rank files, as the spec's default redirects=3 says).
    world = cmd.max_nodes * nproc
    builder.logs(tee=torchrun_tee(cmd.redirects, cmd.tee, world, cmd.local_ranks_filter, nproc))
    trainer = builder.role(role).train(cmd.entrypoint).nnodes(cmd.nnodes).nproc_per_node(nproc)
    if cmd.max_restarts is not None:
        trainer.max_restart(cmd.max_restarts)
    return builder.build()
