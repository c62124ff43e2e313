"""What a client reads back about a job. The PrimeMaster fills these; the CLI prints them."""

from __future__ import annotations

from enum import StrEnum

from pydantic import BaseModel, Field


class JobStage(StrEnum):
    """PrimeManager stages, plus PENDING for a job the cluster has accepted but not started, and
    LOST for a local job whose process is gone: it was killed or crashed before it could record
    the job's end (no PrimeManager is ever LOST; a client reads it)."""

    PENDING = "PENDING"
    INIT = "INIT"
    READY = "READY"
    RUNNING = "RUNNING"
    STOPPING = "STOPPING"
    STOPPED = "STOPPED"
    LOST = "LOST"

    @property
    def is_terminal(self) -> bool:
        return self in (JobStage.STOPPED, JobStage.LOST)


class ActorStatus(BaseModel):
    name: str
    role: str
    rank: int
    stage: str
    node_id: str | None = None
    restart_count: int = 0
    step: int | None = Field(default=None, description="Last training step the actor reported.")
    metric: float | None = Field(
        default=None,
        description="Last metric the actor's code reported with `heartbeat(step, metric)` (a loss, say).",
    )
    cpu_percent: float | None = Field(
        default=None, description="CPU use of the actor's process and its children (100 = one core)."
    )
    memory_bytes: int | None = Field(default=None, description="Resident memory of the actor's processes.")
    memory_limit_bytes: int | None = Field(
        default=None,
        description="The memory a memory relaunch gave the actor (bytes asked of Ray); unset: its role's.",
    )
    gpu_percent: float | None = Field(default=None, description="GPU use, where the actor has one.")


class ThroughputAtSize(BaseModel):
    """A role's measured speed at one world size (nodes of an elastic role, actors otherwise)."""

    world_size: int
    steps_per_s: float | None = None
    samples_per_s: float | None = None


class RoleStatus(BaseModel):
    name: str
    kind: str
    restart_count: int = 0
    inplace_restart_count: int = 0
    sub_master_restart_count: int = Field(
        default=0, description="Restarts of the role's SubMaster (tier sub_master), apart from its workers'."
    )
    size: int = Field(default=0, description="Actors the role has now (after any `dlu scale`).")
    resize_count: int = 0
    nodes: int | None = Field(default=None, description="An elastic role's nodes now.")
    min_nodes: int | None = Field(default=None, description="An elastic role's MIN (nnodes MIN:MAX).")
    max_nodes: int | None = Field(default=None, description="An elastic role's MAX (nnodes MIN:MAX).")
    pending_nodes: int | None = Field(
        default=None,
        description="Nodes an elastic role still asks Ray for, to reach MAX (or the node count `dlu scale` set).",
    )
    actors: list[ActorStatus] = Field(default_factory=list[ActorStatus])


class JobEvent(BaseModel):
    """One entry of the job's event timeline."""

    time: float
    kind: str
    message: str
    role: str | None = None
    actor: str | None = None
    node_id: str | None = None
    tier: str | None = Field(default=None, description="The failover tier of a recovery event.")
    duration_s: float | None = Field(default=None, description="How long a finished recovery took.")
    seq: int = Field(
        default=0,
        description="Position in the job's timeline (1, 2, ...), so a client can ask for what follows "
        "a cursor rather than a fixed tail; 0 on events stored before positions existed.",
    )


class EventCursor:
    """Where a follower is in a job's timeline: `take` returns the events it has not seen yet.

    By position (`JobEvent.seq`), not by index, so a bounded timeline that dropped old events, or
    an answer holding only the newest, loses or repeats none. Events without positions (written
    before they existed) are counted by index, as the whole list from the start.
    """

    def __init__(self) -> None:
        self.position = 0
        self._count = 0

    def take(self, events: list[JobEvent]) -> list[JobEvent]:
        if events and all(e.seq for e in events):
            fresh = [e for e in events if e.seq > self.position]
            self.position = max(self.position, events[-1].seq)
            return fresh
        fresh = events[self._count :] if len(events) >= self._count else events
        self._count = len(events)
        return fresh


class JobStatus(BaseModel):
    name: str
    stage: JobStage
    exit_code: int | None = None
    reason: str = ""
    job_restart_count: int = 0
    global_restart_count: int = 0
    master_restart_count: int = 0
    node_restart_count: int = 0
    removed_nodes: list[str] = Field(default_factory=list[str])
    roles: list[RoleStatus] = Field(default_factory=list[RoleStatus])
    events: list[JobEvent] = Field(default_factory=list[JobEvent])
    first_failure: JobEvent | None = Field(
        default=None,
        description="The job's first failure, kept even after the bounded timeline dropped it.",
    )
    run_id: str = Field(
        default="", description="This run of the job; its rank logs are under <log dir>/<job>/<run_id>/."
    )
    throughput: dict[str, list[ThroughputAtSize]] = Field(
        default_factory=dict[str, list[ThroughputAtSize]],
        description="Each role's measured speed at each world size it ran at, by role name.",
    )
    backlogs: dict[str, int] = Field(
        default_factory=dict[str, int], description="Items waiting in each data channel or shard queue."
    )
    autoscale: str | None = Field(
        default=None,
        description="Who sizes the roles now, for an auto-scaled job: 'single-job', or 'cluster' with "
        "whether the Brain answers (and the statistics buffered while it does not).",
    )
    free_bundles: list[str] = Field(
        default_factory=list[str],
        description="Bundles reserved for the job that its actors left (a memory relaunch) and no "
        "actor uses all of, e.g. 'bundle 1 of group prep free, memory 512 MiB reserved unused'.",
    )
    log_dir: str | None = Field(
        default=None,
        description="Root of the rank log files (the spec's logs.dir, or $DLU_HOME/logs for a local "
        "job); None: the Ray session's log dir on each node (its dlu/ folder).",
    )

    @property
    def finished(self) -> bool:
        return self.stage.is_terminal


class JobSummary(BaseModel):
    name: str
    stage: JobStage
    exit_code: int | None = None
    where: str = Field(default="local", description="'local' or the cluster address.")
    start_time: float | None = Field(
        default=None, description="Unix time of the job's first event, if known."
    )
    end_time: float | None = Field(default=None, description="Unix time of a finished job's last event.")
