"""The job spec: one pydantic document that the driver sends and the PrimeMaster runs.

Models check shape and ranges; rules that span fields live in `dlu_api.spec.rules`, so that
`dlu validate` can report every such problem at once.
"""

from __future__ import annotations

import re
from enum import StrEnum
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    JsonValue,
    ValidationInfo,
    field_validator,
    model_validator,
)

from dlu_api.rank_logs import parse_modes
from dlu_api.spec.entrypoint import EntrypointKind, parse_entrypoint
from dlu_api.spec.torchrun import parse_nnodes, parse_torchrun
from dlu_api.spec.units import parse_memory

API_VERSION = "dlu/v1"
NAME_PATTERN = r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$"
ROLE_PATTERN = r"^[A-Za-z][A-Za-z0-9_-]{0,62}$"


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


MemoryBytes = Annotated[
    int,
    BeforeValidator(parse_memory),
    Field(description="Bytes; strings like '4GiB' or '512MB' are accepted and stored as bytes."),
]


class DeviceType(StrEnum):
    GPU = "GPU"
    CPU = "CPU"


class RoleKind(StrEnum):
    SIMPLE = "simple"
    ELASTIC = "elastic"
    CUSTOM = "custom"


class RecoveryPolicy(StrEnum):
    """The health seed's two strategies for a failed role."""

    IN_PLACE = "in_place"
    GLOBAL = "global"


class PlacementStrategy(StrEnum):
    PACK = "PACK"
    SPREAD = "SPREAD"
    STRICT_PACK = "STRICT_PACK"
    STRICT_SPREAD = "STRICT_SPREAD"


class CommBackend(StrEnum):
    AUTO = "auto"  # nccl on GPU, gloo on CPU
    GLOO = "gloo"
    NCCL = "nccl"


class Resources(_Model):
    """What one actor of a role asks Ray for."""

    cpu: float = Field(default=1.0, ge=0, description="CPU cores per actor.")
    memory: MemoryBytes = 0
    gpu: float | None = Field(
        default=None,
        ge=0,
        description="GPUs per actor. Unset: 1 for elastic roles of a GPU job, else 0.",
    )
    custom: dict[str, float] = Field(
        default_factory=dict, description="Custom Ray resources per actor, by name."
    )

    @field_validator("custom")
    @classmethod
    def _no_builtin_names(cls, value: dict[str, float]) -> dict[str, float]:
        for name, amount in value.items():
            if name in ("CPU", "GPU", "memory", "object_store_memory"):
                raise ValueError(f"custom resource {name!r} is built in; use the cpu/gpu/memory fields")
            if amount < 0:
                raise ValueError(f"custom resource {name!r} must be >= 0")
        return value


class NodeCheckSettings(_Model):
    """Thresholds of the pre-training node check (timed matmul + allreduce in node pairs)."""

    enabled: bool = True
    timeout_s: float = Field(default=300.0, gt=0, description="A check round slower than this fails.")
    straggler_ratio: float = Field(
        default=2.0,
        gt=1,
        description="A node whose best time exceeds the median by this factor is a straggler.",
    )
    exclude_stragglers: bool = False
    matmul_size: int = Field(default=1024, ge=16, description="Side of the square matmul.")
    allreduce_mb: float = Field(default=16.0, gt=0, description="Size of the allreduce payload.")


class ElasticSettings(_Model):
    """torchrun's knobs for an elastic role."""

    nnodes: str = Field(default="1", description="Node count 'N', or an elastic range 'MIN:MAX'.")
    nproc_per_node: int = Field(default=1, ge=1)
    comm_backend: CommBackend = CommBackend.AUTO
    node_check: NodeCheckSettings = Field(default_factory=NodeCheckSettings)
    setup_process_group: bool = Field(
        default=True, description="Call init_process_group before user code runs (functions only)."
    )
    agent_store: bool = Field(
        default=True,
        description="Host the process group's TCPStore before training starts, as torchrun's agent "
        "does (TORCHELASTIC_USE_AGENT_STORE=True), so no rank waits for rank 0's; false: rank 0's "
        "process hosts it.",
    )
    rendezvous_grace_s: float = Field(
        default=30.0,
        ge=0,
        description="With a MIN:MAX range, how long to wait for MAX nodes once MIN have joined.",
    )
    start_timeout_s: float = Field(
        default=60.0,
        gt=0,
        description="With a MIN:MAX range, how long the job waits for Ray to place MAX nodes before it "
        "starts with the nodes it has (at least MIN; fewer: it stops, saying what was missing).",
    )
    replace_timeout_s: float = Field(
        default=30.0,
        gt=0,
        description="With a MIN:MAX range, how long a node's ranks may stay unplaceable (Ray restarting "
        "them) before the node counts as lost for good and the role shrinks in place.",
    )
    resize_interval_s: float = Field(
        default=60.0,
        ge=0,
        description="With a MIN:MAX range, the least time between two automatic resizes of the role "
        "(a flapping node cannot make it thrash).",
    )

    @field_validator("nnodes", mode="before")
    @classmethod
    def _nnodes_text(cls, value: Any) -> Any:
        if isinstance(value, int) and not isinstance(value, bool):
            return str(value)
        return value

    @field_validator("nnodes")
    @classmethod
    def _nnodes_range(cls, value: str) -> str:
        parse_nnodes(value)
        return value

    @property
    def min_nodes(self) -> int:
        return parse_nnodes(self.nnodes)[0]

    @property
    def max_nodes(self) -> int:
        return parse_nnodes(self.nnodes)[1]


class RoleSpec(_Model):
    """One role of the job: N actors running the same entrypoint."""

    name: str = Field(pattern=ROLE_PATTERN)
    kind: RoleKind = RoleKind.SIMPLE
    entrypoint: str = Field(min_length=1)
    total: int = Field(default=1, description="Actor count; for elastic roles nnodes x nproc_per_node.")
    per_group: int = Field(default=1, description="Actors per placement bundle (per node); sets LOCAL_RANK.")
    resources: Resources = Field(default_factory=Resources)
    env: dict[str, str] = Field(default_factory=dict)
    max_restart: int = Field(
        default=10,
        description="Restarts of this role (actor restarts, and in-place restarts of its training) before the job stops.",
    )
    per_node_max_failure: int = Field(
        default=3, description="Failures on one node before that node is relaunched."
    )
    is_driver: bool = Field(default=True, description="The job ends when every driver role has finished.")
    resizable: bool = Field(
        default=True,
        description="`dlu scale` may change the size of this role: the actor count of a simple role, "
        "the node count (within MIN..MAX) of an elastic one.",
    )
    max_total: int | None = Field(
        default=None, ge=1, description="The largest actor count `dlu scale` may set; unset: no bound."
    )
    rank_based_gpu_selection: bool = False
    recovery: RecoveryPolicy | None = Field(
        default=None,
        description=(
            "in_place: a failure restarts only this role (through its SubMaster if it has one); "
            "global: a failure restarts the whole job. Unset: in_place for roles with a SubMaster, "
            "global otherwise (the failover seed's job-level restart)."
        ),
    )
    escalate_after: int = Field(
        default=3, description="Restarts after which any failure of this role restarts the job."
    )
    sub_master: str | None = Field(
        default=None, description="'module:Class' of the SubMaster; required for kind=custom."
    )
    elastic: ElasticSettings | None = None

    @model_validator(mode="before")
    @classmethod
    def _derive_elastic(cls, data: Any) -> Any:
        return cls._fill_elastic_counts(cls._fill_from_torchrun(data))

    @classmethod
    def _fill_from_torchrun(cls, data: Any) -> Any:
        """A torchrun entrypoint of an elastic role supplies nnodes and nproc_per_node."""
        if not isinstance(data, dict):
            return data
        entry = data.get("entrypoint")  # pyright: ignore[reportUnknownMemberType, reportUnknownVariableType]
        if data.get("kind") != RoleKind.ELASTIC or not isinstance(entry, str):  # pyright: ignore[reportUnknownMemberType]
            return data  # pyright: ignore[reportUnknownVariableType]
        try:
            if parse_entrypoint(entry).kind is not EntrypointKind.TORCHRUN:
                return data  # pyright: ignore[reportUnknownVariableType]
            cmd = parse_torchrun(entry)
        except ValueError:
            return data  # pyright: ignore[reportUnknownVariableType]
        out: dict[str, Any] = dict(data)  # pyright: ignore[reportUnknownArgumentType]
        elastic: dict[str, Any] = dict(out.get("elastic") or {})
        elastic.setdefault("nnodes", cmd.nnodes)
        if isinstance(cmd.nproc_per_node, int):
            elastic.setdefault("nproc_per_node", cmd.nproc_per_node)
        out["elastic"] = elastic
        return out

    @classmethod
    def _fill_elastic_counts(cls, data: Any) -> Any:
        """Elastic roles may leave total and per_group out: they follow nnodes x nproc_per_node."""
        if not isinstance(data, dict) or data.get("kind") != RoleKind.ELASTIC:  # pyright: ignore[reportUnknownMemberType]
            return data  # pyright: ignore[reportUnknownVariableType]
        out: dict[str, Any] = dict(data)  # pyright: ignore[reportUnknownArgumentType]
        raw: Any = out.get("elastic") or {}
        if isinstance(raw, ElasticSettings):
            raw = raw.model_dump()
        if not isinstance(raw, dict):
            return out
        elastic: dict[str, Any] = raw  # pyright: ignore[reportUnknownVariableType]
        try:
            nproc = int(elastic.get("nproc_per_node", 1))
            max_nodes = parse_nnodes(str(elastic.get("nnodes", "1")))[1]
        except (TypeError, ValueError):
            return out  # field validation reports it
        out.setdefault("per_group", nproc)
        out.setdefault("total", max_nodes * nproc)
        return out

    @model_validator(mode="after")
    def _elastic_defaults(self) -> RoleSpec:
        if self.kind is RoleKind.ELASTIC and self.elastic is None:
            self.elastic = ElasticSettings()
        return self


class Collocation(_Model):
    """Roles whose actors share placement bundles (and so nodes and GPUs)."""

    roles: list[str] = Field(min_length=2)


class StateStoreSpec(_Model):
    """Which state store keeps the PrimeMaster's state, by registered name."""

    name: str = Field(default="embedded", description="'embedded', 'memory', 'redis', or a plugin.")
    options: dict[str, JsonValue] = Field(default_factory=dict)


class Limits(_Model):
    """Restart budgets; exceeding one stops the job with a reason naming it."""

    job_max_restart: int = Field(default=10, ge=0)
    node_max_restart: int = Field(default=10, ge=0)
    master_max_restart: int = Field(default=10, ge=0)
    global_restart_budget: int = Field(
        default=3, ge=0, description="Job-wide (global) restarts allowed, as in the health seed."
    )


class HealthSettings(_Model):
    heartbeat_interval_s: float = Field(default=5.0, gt=0)
    heartbeat_timeout_s: float = Field(default=120.0, gt=0)
    hang_timeout_s: float | None = Field(
        default=None, gt=0, description="No training step for this long counts as a hang; unset: off."
    )
    monitor_interval_s: float = Field(default=1.0, gt=0)


class MasterSettings(_Model):
    """Resources of the PrimeMaster actor and the isolation resources that pin actors to nodes."""

    cpu: float = Field(default=1.0, ge=0)
    memory: MemoryBytes = 0
    isolation_resource: str | None = Field(
        default=None, description="Custom resource that only the PrimeMaster's nodes offer."
    )
    worker_isolation_resource: str | None = Field(
        default=None, description="Custom resource that only the worker nodes offer."
    )


def _mode_text(value: Any) -> Any:
    return str(value) if isinstance(value, int) and not isinstance(value, bool) else value


StreamMode = Annotated[str, BeforeValidator(_mode_text)]


class LogsSettings(_Model):
    """Per-rank log files: `<dir>/<job>/<run_id>/<role>/rank<N>.out` and `.err`, as torchrun's
    `--log-dir`, `--redirects` and `--tee`."""

    dir: str | None = Field(
        default=None,
        description="Absolute root of the rank log files; unset: $DLU_HOME/logs for a local job, "
        "the Ray session's log dir (its dlu/ folder) on each node of a cluster.",
    )
    redirects: StreamMode = Field(
        default="3",
        description="Streams written to the rank files instead of the actor's output: 0 none, "
        "1 stdout, 2 stderr, 3 both, or per rank, e.g. '0:3,1:2'.",
    )
    tee: StreamMode = Field(
        default="0",
        description="Streams written to the rank files and also printed by `dlu run` with a "
        "[role/rankN] prefix; same forms as redirects.",
    )

    @field_validator("dir")
    @classmethod
    def _absolute(cls, value: str | None) -> str | None:
        if value is None:
            return None
        if not value.strip():
            raise ValueError(
                "logs.dir is empty: give an absolute path, e.g. dir: /data/logs, or leave it out"
            )
        if not value.startswith(("/", "~")):
            raise ValueError(
                f"logs.dir {value!r} is relative (it would mean another folder on each node): "
                "give an absolute path, e.g. dir: /data/logs"
            )
        return value

    @field_validator("redirects", "tee")
    @classmethod
    def _modes(cls, value: str, info: ValidationInfo) -> str:
        parse_modes(value, f"logs.{info.field_name}")
        return value


class JobSpec(_Model):
    """A DLU job. `dlu schema` prints its JSON Schema."""

    api_version: Literal["dlu/v1"] = API_VERSION
    name: str = Field(pattern=NAME_PATTERN, description="Lowercase letters, digits and '-'.")
    config: dict[str, JsonValue] = Field(
        default_factory=dict, description="User config, readable in workers."
    )
    env: dict[str, str] = Field(default_factory=dict, description="Env vars of every actor.")
    node_num: int = Field(default=1, description="Nodes the job may use.")
    device_per_node: int = Field(default=8, description="Accelerators per node.")
    device_type: DeviceType = DeviceType.GPU
    roles: list[RoleSpec] = Field(min_length=1)
    collocations: list[Collocation] = Field(default_factory=list[Collocation])
    placement_strategy: PlacementStrategy = PlacementStrategy.PACK
    state_store: StateStoreSpec = Field(default_factory=StateStoreSpec)
    limits: Limits = Field(default_factory=Limits)
    extension: str | None = Field(
        default=None,
        description=(
            "Name of an entry point in the 'dlu.extensions' group (or 'module:Class') whose "
            "relaunch_nodes_impl replaces nodes that fail too often."
        ),
    )
    health: HealthSettings = Field(default_factory=HealthSettings)
    master: MasterSettings = Field(default_factory=MasterSettings)
    logs: LogsSettings = Field(default_factory=LogsSettings)

    @model_validator(mode="after")
    def _default_gpus(self) -> JobSpec:
        """Elastic ranks of a GPU job get one GPU unless the spec says otherwise."""
        for role in self.roles:
            if role.resources.gpu is None:
                wants_gpu = self.device_type is DeviceType.GPU and role.kind is RoleKind.ELASTIC
                role.resources.gpu = 1.0 if wants_gpu else 0.0
        return self

    def role(self, name: str) -> RoleSpec:
        """The role called `name`.

        Raises:
            KeyError: no such role.
        """
        for role in self.roles:
            if role.name == name:
                return role
        raise KeyError(f"job {self.name!r} has no role {name!r}")

    def collocation_of(self, role: str) -> int | None:
        """Index of the collocation that holds `role`, if any."""
        for index, group in enumerate(self.collocations):
            if role in group.roles:
                return index
        return None


def is_valid_job_name(name: str) -> bool:
    return re.match(NAME_PATTERN, name) is not None
