"""DLU driver side: job spec, builders, client and CLI.

Importing this package never imports ray, torch or grpc.
"""

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
