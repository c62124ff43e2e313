"""DLU driver side: job spec, builders, client and CLI.

Importing this package never imports ray, torch or grpc. Its names are loaded on first use:
every PrimeMaster and worker imports `dlu_api.spec`, which imports this package first, and
must not pay for the client's HTTP and terminal libraries (a reconstructed PrimeMaster does
this import on its recovery path).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from dlu_api.builder import DLJobBuilder, RLJobBuilder, from_torchrun_cmd
    from dlu_api.client import JobClient, connect
    from dlu_api.errors import (
        ClusterError,
        DLUError,
        JobNotFoundError,
        MissingComponentError,
        Problem,
        SpecError,
    )
    from dlu_api.job import Job, JobHandle
    from dlu_api.spec import JobSpec, RoleSpec, check_spec, dump_spec, load_spec
    from dlu_api.status import JobStage, JobStatus

__version__ = "0.1.0"

_SOURCES: dict[str, str] = {
    "ClusterError": "dlu_api.errors",
    "DLJobBuilder": "dlu_api.builder",
    "DLUError": "dlu_api.errors",
    "Job": "dlu_api.job",
    "JobClient": "dlu_api.client",
    "JobHandle": "dlu_api.job",
    "JobNotFoundError": "dlu_api.errors",
    "JobSpec": "dlu_api.spec",
    "JobStage": "dlu_api.status",
    "JobStatus": "dlu_api.status",
    "MissingComponentError": "dlu_api.errors",
    "Problem": "dlu_api.errors",
    "RLJobBuilder": "dlu_api.builder",
    "RoleSpec": "dlu_api.spec",
    "SpecError": "dlu_api.errors",
    "check_spec": "dlu_api.spec",
    "connect": "dlu_api.client",
    "dump_spec": "dlu_api.spec",
    "from_torchrun_cmd": "dlu_api.builder",
    "load_spec": "dlu_api.spec",
}


def __getattr__(name: str) -> Any:
    """Load a public name from its module on first use (PEP 562)."""
    source = _SOURCES.get(name)
    if source is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(source), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_SOURCES})


__all__ = [
    "ClusterError",
    "DLJobBuilder",
    "DLUError",
    "Job",
    "JobClient",
    "JobHandle",
    "JobNotFoundError",
    "JobSpec",
    "JobStage",
    "JobStatus",
    "MissingComponentError",
    "Problem",
    "RLJobBuilder",
    "RoleSpec",
    "SpecError",
    "check_spec",
    "connect",
    "dump_spec",
    "from_torchrun_cmd",
    "load_spec",
]
