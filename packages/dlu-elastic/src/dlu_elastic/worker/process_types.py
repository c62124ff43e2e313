"""What a training process runs (`ProcessSpec`) and what it reports (`ProcessEvent`).

Shared by the launcher side (`process`) and the child side (`process_child`), so that neither
imports the other for its types.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

from dlu_api.spec.entrypoint import Entrypoint, EntrypointKind, parse_entrypoint
from dlu_api.spec.torchrun import parse_torchrun
from dlu_prime.worker.rank_logs import RankOutput

BACKENDS = ("gloo", "nccl", "auto")
# Set by the launcher on every process it starts; also where `current_worker().device` reads.
DEVICE_ENV = "DLU_DEVICE"
PASSED_FDS_ENV = "DLU_PASSED_FDS"  # `ProcessSpec.pass_fds` as the process numbers them


class ProcessEventKind(StrEnum):
    STARTED = "started"  # the child runs; message: its pid and whether torch was preloaded
    HEARTBEAT = "heartbeat"  # dlu_prime.runtime.heartbeat(step, metric) in training code
    ERROR_REPORT = "error_report"  # dlu_prime.runtime.report_error(message)
    FAILURE = "failure"  # the entrypoint raised or exited non-zero; message: the traceback


@dataclass(frozen=True)
class ProcessEvent:
    """One message from a training process, timestamped in the child."""

    kind: ProcessEventKind
    time: float
    step: int | None = None
    metric: float | None = None
    message: str | None = None
    exit_code: int | None = None  # FAILURE: the code the process is exiting with


@dataclass
class ProcessSpec:
    """What one training process runs.

    `entrypoint`: 'module:function', 'module.function', 'script.py args...', '-m module args...',
    or a whole torchrun command (only its script part is used: DLU does the rendezvous).
    `env`: torchrun's variables (see torchrun_env.py: RANK, LOCAL_RANK, WORLD_SIZE, GROUP_RANK,
    GROUP_WORLD_SIZE, ROLE_NAME, MASTER_ADDR, TORCHELASTIC_RESTART_COUNT,
    TORCHELASTIC_ERROR_FILE, ...) and anything else; set over the environment
    the actor had when the launcher warmed up. DLU_JOB, DLU_ROLE, DLU_ACTOR and DLU_CONFIG_JSON
    feed `current_worker()`.
    `workdir`: the directory the process runs in and imports from; None: the caller's cwd at
    `start()`.
    `setup_process_group`: for function entrypoints, `init_process_group` from the environment
    before the call (scripts set up their own, as under torchrun).
    `backend`: "gloo", "nccl", or "auto" (NCCL when `device` is CUDA, gloo otherwise).
    `device`: "cpu", "cuda", "cuda:1"; exported as DLU_DEVICE (unless `env` sets it) and made
    the current CUDA device before an automatic NCCL process group.
    `output`: the rank's log files (opened for appending at each start); None: the process
    writes to the actor's stdout and stderr.
    `pass_fds`: descriptors of the caller the process gets copies of (their numbers in the
    process are in PASSED_FDS_ENV, comma-separated, in this order), such as a listening socket.
    """

    entrypoint: str
    env: dict[str, str] = field(default_factory=dict[str, str])
    workdir: str | None = None
    setup_process_group: bool = True
    backend: str = "auto"
    device: str = "cpu"
    pg_timeout_s: float = 300.0
    output: RankOutput | None = None
    pass_fds: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if self.backend not in BACKENDS:
            raise ValueError(f"backend {self.backend!r} is not one of {', '.join(BACKENDS)}")
        if not (self.device == "cpu" or self.device == "cuda" or self.device.startswith("cuda:")):
            raise ValueError(f"device {self.device!r} is not 'cpu', 'cuda' or 'cuda:N'")
        self.env = {str(k): str(v) for k, v in self.env.items()}

    def resolved_entrypoint(self) -> Entrypoint:
        """The entrypoint to run; a torchrun command becomes its script or module.

        Raises:
            ValueError: not an accepted entrypoint form, or a torchrun command DLU cannot run.
        """
        entry = parse_entrypoint(self.entrypoint)
        if entry.kind is EntrypointKind.TORCHRUN:
            entry = parse_entrypoint(parse_torchrun(entry.target).entrypoint)
        return entry

    def resolved_backend(self) -> str:
        if self.backend != "auto":
            return self.backend
        return "nccl" if self.device.startswith("cuda") else "gloo"
