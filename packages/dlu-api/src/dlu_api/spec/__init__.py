"""The job spec: models, parsing, cross-field rules and YAML/JSON I/O."""

from dlu_api.spec.entrypoint import Entrypoint, EntrypointKind, parse_entrypoint
from dlu_api.spec.io import dump_spec, job_schema, load_spec, load_spec_text, spec_from_dict, spec_to_dict
from dlu_api.spec.models import (
    API_VERSION,
    AutoscaleMode,
    AutoscaleSettings,
    Collocation,
    CommBackend,
    DeviceType,
    ElasticSettings,
    HealthSettings,
    JobSpec,
    Limits,
    MasterSettings,
    NodeCheckSettings,
    PlacementStrategy,
    RecoveryPolicy,
    Resources,
    RoleKind,
    RoleSpec,
    StateStoreSpec,
)
from dlu_api.spec.rules import check_spec, ensure_valid
from dlu_api.spec.torchrun import TorchrunCommand, parse_torchrun
from dlu_api.spec.units import parse_memory

__all__ = [
    "API_VERSION",
    "AutoscaleMode",
    "AutoscaleSettings",
    "Collocation",
    "CommBackend",
    "DeviceType",
    "ElasticSettings",
    "Entrypoint",
    "EntrypointKind",
    "HealthSettings",
    "JobSpec",
    "Limits",
    "MasterSettings",
    "NodeCheckSettings",
    "PlacementStrategy",
    "RecoveryPolicy",
    "Resources",
    "RoleKind",
    "RoleSpec",
    "StateStoreSpec",
    "TorchrunCommand",
    "check_spec",
    "dump_spec",
    "ensure_valid",
    "job_schema",
    "load_spec",
    "load_spec_text",
    "parse_entrypoint",
    "parse_memory",
    "parse_torchrun",
    "spec_from_dict",
    "spec_to_dict",
]
