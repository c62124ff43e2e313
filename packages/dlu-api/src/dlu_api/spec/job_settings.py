"""Job-wide settings in the job spec: state store, restart limits, health, the PrimeMaster's
resources and the per-rank log files.

Part of the job spec (`dlu_api.spec.models`, which re-exports these models).
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BeforeValidator, Field, JsonValue, ValidationInfo, field_validator

from dlu_api.rank_logs import parse_modes
from dlu_api.spec.model_base import MAX_AMOUNT, MAX_COUNT, MAX_SECONDS, MemoryBytes, SpecModel


class StateStoreSpec(SpecModel):
    """Which state store keeps the PrimeMaster's state, by registered name."""

    name: str = Field(default="embedded", description="'embedded', 'memory', 'redis', or a plugin.")
    options: dict[str, JsonValue] = Field(default_factory=dict)

    @field_validator("name")
    @classmethod
    def _named(cls, value: str) -> str:
        if not value.strip():
            raise ValueError(
                "state_store.name is empty: write 'embedded' (the default), 'memory', 'redis' or "
                "a plugin's name, or leave state_store out"
            )
        return value


class Limits(SpecModel):
    """Restart budgets; exceeding one stops the job with a reason naming it."""

    job_max_restart: int = Field(default=10, ge=0, le=MAX_COUNT)
    node_max_restart: int = Field(default=10, ge=0, le=MAX_COUNT)
    master_max_restart: int = Field(default=10, ge=0, le=MAX_COUNT)
    global_restart_budget: int = Field(
        default=3,
        ge=0,
        le=MAX_COUNT,
        description="Job-wide (global) restarts allowed, as in the health seed.",
    )


class HealthSettings(SpecModel):
    heartbeat_interval_s: float = Field(default=5.0, gt=0, le=MAX_SECONDS)
    heartbeat_timeout_s: float = Field(default=120.0, gt=0, le=MAX_SECONDS)
    hang_timeout_s: float | None = Field(
        default=None,
        gt=0,
        le=MAX_SECONDS,
        description="No training step for this long counts as a hang; unset: off.",
    )
    monitor_interval_s: float = Field(default=1.0, gt=0, le=MAX_SECONDS)
    stall_timeout_s: float | None = Field(
        default=60.0,
        gt=0,
        le=MAX_SECONDS,
        allow_inf_nan=False,
        description="No progress anywhere in the job (no step, beat, stage change or channel item) "
        "for this long is reported as a stall, naming what waits on what; not a failure, nothing "
        "is restarted. null: off.",
    )


class MasterSettings(SpecModel):
    """Resources of the PrimeMaster actor and the isolation resources that pin actors to nodes."""

    cpu: float = Field(default=1.0, ge=0, le=MAX_AMOUNT)
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


class LogsSettings(SpecModel):
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
