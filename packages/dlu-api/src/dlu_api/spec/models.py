"""The job spec: one pydantic document that the driver sends and the PrimeMaster runs.

The top-level models are here; the elastic role's settings are in
`dlu_api.spec.elastic_settings`, the job-wide ones in `dlu_api.spec.job_settings` (all
re-exported here). Models check shape and ranges; rules that span fields live in
`dlu_api.spec.rules`, so that `dlu validate` can report every such problem at once.
"""

from __future__ import annotations

import re
from enum import StrEnum
from typing import Any, Literal

from pydantic import (
    Field,
    JsonValue,
    field_validator,
    model_validator,
)

from dlu_api.spec.autoscale_settings import AutoscaleMode, AutoscaleSettings
from dlu_api.spec.elastic_settings import CheckpointSettings, CommBackend, ElasticSettings, NodeCheckSettings
from dlu_api.spec.entrypoint import EntrypointKind, parse_entrypoint
from dlu_api.spec.job_settings import HealthSettings, Limits, LogsSettings, MasterSettings, StateStoreSpec
from dlu_api.spec.model_base import (
    MAX_ACTORS,
    MAX_AMOUNT,
    MAX_COUNT,
    MAX_NODES,
    MAX_PER_NODE,
    MemoryBytes,
    SpecModel,
)
from dlu_api.spec.torchrun import parse_nnodes, parse_torchrun

API_VERSION = "dlu/v1"
NAME_PATTERN = r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$"
ROLE_PATTERN = r"^[A-Za-z][A-Za-z0-9_-]{0,62}$"

# The sub-models live in `elastic_settings`, `job_settings` and `model_base`; callers import
# every spec model from here.
__all__ = [
    "API_VERSION",
    "NAME_PATTERN",
    "ROLE_PATTERN",
    "AutoscaleMode",
    "AutoscaleSettings",
    "CheckpointSettings",
    "Collocation",
    "CommBackend",
    "DeviceType",
    "ElasticSettings",
    "HealthSettings",
    "JobSpec",
    "Limits",
    "LogsSettings",
    "MasterSettings",
    "MemoryBytes",
    "NodeCheckSettings",
    "PlacementStrategy",
    "RecoveryPolicy",
    "Resources",
    "RoleKind",
    "RoleSpec",
    "StateStoreSpec",
    "is_valid_job_name",
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


class Resources(SpecModel):
    """What one actor of a role asks Ray for."""

    cpu: float = Field(default=1.0, ge=0, le=MAX_AMOUNT, description="CPU cores per actor.")
    memory: MemoryBytes = 0
    gpu: float | None = Field(
        default=None,
        ge=0,
        le=MAX_AMOUNT,
        description="GPUs per actor. Unset: 1 for elastic roles of a GPU job, else 0.",
    )
    custom: dict[str, float] = Field(
        default_factory=dict, description="Custom Ray resources per actor, by name."
    )

    @field_validator("custom", mode="before")
    @classmethod
    def _no_boolean_amounts(cls, value: Any) -> Any:
        if isinstance(value, dict):
            for name, amount in value.items():  # pyright: ignore[reportUnknownVariableType]
                if isinstance(amount, bool):
                    raise ValueError(f"custom resource {name!r} is {str(amount).lower()}, not an amount")
        return value  # pyright: ignore[reportUnknownVariableType]

    @field_validator("custom")
    @classmethod
    def _no_builtin_names(cls, value: dict[str, float]) -> dict[str, float]:
        for name, amount in value.items():
            if name in ("CPU", "GPU", "memory", "object_store_memory"):
                raise ValueError(f"custom resource {name!r} is built in; use the cpu/gpu/memory fields")
            if not 0 <= amount <= MAX_AMOUNT:
                raise ValueError(f"custom resource {name!r} must be between 0 and {MAX_AMOUNT:g}")
        return value


class RoleSpec(SpecModel):
    """One role of the job: N actors running the same entrypoint."""

    name: str = Field(pattern=ROLE_PATTERN)
    kind: RoleKind = RoleKind.SIMPLE
    entrypoint: str = Field(min_length=1)
    total: int = Field(
        default=1, le=MAX_ACTORS, description="Actor count; for elastic roles nnodes x nproc_per_node."
    )
    per_group: int = Field(
        default=1, le=MAX_PER_NODE, description="Actors per placement bundle (per node); sets LOCAL_RANK."
    )
    resources: Resources = Field(default_factory=Resources)
    env: dict[str, str] = Field(default_factory=dict)
    max_restart: int = Field(
        default=10,
        le=MAX_COUNT,
        description="Restarts of this role (actor restarts, and in-place restarts of its training) before the job stops.",
    )
    per_node_max_failure: int = Field(
        default=3, le=MAX_COUNT, description="Failures on one node before that node is relaunched."
    )
    is_driver: bool = Field(default=True, description="The job ends when every driver role has finished.")
    resizable: bool = Field(
        default=True,
        description="`dlu scale` may change the size of this role: the actor count of a simple role, "
        "the node count (within MIN..MAX) of an elastic one.",
    )
    max_total: int | None = Field(
        default=None,
        ge=1,
        le=MAX_ACTORS,
        description="The largest actor count `dlu scale` may set; unset: no bound.",
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
        default=3, le=MAX_COUNT, description="Restarts after which any failure of this role restarts the job."
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


class Collocation(SpecModel):
    """Roles whose actors share placement bundles (and so nodes and GPUs)."""

    roles: list[str] = Field(min_length=2)


class JobSpec(SpecModel):
    """A DLU job. `dlu schema` prints its JSON Schema."""

    api_version: Literal["dlu/v1"] = API_VERSION
    name: str = Field(pattern=NAME_PATTERN, description="Lowercase letters, digits and '-'.")
    config: dict[str, JsonValue] = Field(
        default_factory=dict, description="User config, readable in workers."
    )
    env: dict[str, str] = Field(default_factory=dict, description="Env vars of every actor.")
    node_num: int = Field(default=1, le=MAX_NODES, description="Nodes the job may use.")
    device_per_node: int = Field(default=8, le=MAX_PER_NODE, description="Accelerators per node.")
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
    autoscale: AutoscaleSettings = Field(
        default_factory=AutoscaleSettings,
        description="Who sizes the roles while the job runs: off (default), single-job or cluster.",
    )

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
