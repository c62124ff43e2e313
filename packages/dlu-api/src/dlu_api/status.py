"""What a client reads back about a job. The PrimeMaster fills these; the CLI prints them."""

from __future__ import annotations

from enum import StrEnum

from pydantic import BaseModel, Field


class JobStage(StrEnum):
    """PrimeManager stages, plus PENDING for a job the cluster has accepted but not started."""

    PENDING = "PENDING"
    INIT = "INIT"
    READY = "READY"
    RUNNING = "RUNNING"
    STOPPING = "STOPPING"
    STOPPED = "STOPPED"

    @property
    def is_terminal(self) -> bool:
        return self is JobStage.STOPPED


class ActorStatus(BaseModel):
    name: str
    role: str
    rank: int
    stage: str
    node_id: str | None = None
    restart_count: int = 0
    step: int | None = Field(default=None, description="Last training step the actor reported.")


class RoleStatus(BaseModel):
    name: str
    kind: str
    restart_count: int = 0
    actors: list[ActorStatus] = Field(default_factory=list[ActorStatus])


class JobEvent(BaseModel):
    """One entry of the job's event timeline."""

    time: float
    kind: str
    message: str
    role: str | None = None
    actor: str | None = None
    node_id: str | None = None


class JobStatus(BaseModel):
    name: str
    stage: JobStage
    exit_code: int | None = None
    reason: str = ""
    job_restart_count: int = 0
    roles: list[RoleStatus] = Field(default_factory=list[RoleStatus])
    events: list[JobEvent] = Field(default_factory=list[JobEvent])

    @property
    def finished(self) -> bool:
        return self.stage.is_terminal


class JobSummary(BaseModel):
    name: str
    stage: JobStage
    exit_code: int | None = None
    where: str = Field(default="local", description="'local' or the cluster address.")
