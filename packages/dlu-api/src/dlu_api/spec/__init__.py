"""The job spec: models, parsing, cross-field rules and YAML/JSON I/O.

Its names are loaded on first use (PEP 562): a module that needs one part, such as the training
processes' zygote for `dlu_api.spec.entrypoint`, imports this package first and must not pay
for the pydantic models, the YAML loader and the rules (0.1 s of CPU there, beside `import
torch`, while `dlu run` starts Ray).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
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

_SOURCES: dict[str, str] = {
    "API_VERSION": "dlu_api.spec.models",
    "AutoscaleMode": "dlu_api.spec.models",
    "AutoscaleSettings": "dlu_api.spec.models",
    "Collocation": "dlu_api.spec.models",
    "CommBackend": "dlu_api.spec.models",
    "DeviceType": "dlu_api.spec.models",
    "ElasticSettings": "dlu_api.spec.models",
    "Entrypoint": "dlu_api.spec.entrypoint",
    "EntrypointKind": "dlu_api.spec.entrypoint",
    "HealthSettings": "dlu_api.spec.models",
    "JobSpec": "dlu_api.spec.models",
    "Limits": "dlu_api.spec.models",
    "MasterSettings": "dlu_api.spec.models",
    "NodeCheckSettings": "dlu_api.spec.models",
    "PlacementStrategy": "dlu_api.spec.models",
    "RecoveryPolicy": "dlu_api.spec.models",
    "Resources": "dlu_api.spec.models",
    "RoleKind": "dlu_api.spec.models",
    "RoleSpec": "dlu_api.spec.models",
    "StateStoreSpec": "dlu_api.spec.models",
    "TorchrunCommand": "dlu_api.spec.torchrun",
    "check_spec": "dlu_api.spec.rules",
    "dump_spec": "dlu_api.spec.io",
    "ensure_valid": "dlu_api.spec.rules",
    "job_schema": "dlu_api.spec.io",
    "load_spec": "dlu_api.spec.io",
    "load_spec_text": "dlu_api.spec.io",
    "parse_entrypoint": "dlu_api.spec.entrypoint",
    "parse_memory": "dlu_api.spec.units",
    "parse_torchrun": "dlu_api.spec.torchrun",
    "spec_from_dict": "dlu_api.spec.io",
    "spec_to_dict": "dlu_api.spec.io",
}


def __getattr__(name: str) -> Any:
    """Load a public name from its module on first use."""
    source = _SOURCES.get(name)
    if source is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(source), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_SOURCES})


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
