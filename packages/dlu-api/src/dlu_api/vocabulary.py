"""The words every package shares: actor stage, failover tier, failure kind, event kind, and the
in-place verdict a SubMaster gets from the PrimeMaster.

At the bottom of the layering (dlu-api imports nothing of ours; every package imports this), so
no package borrows these from another's internals. Each is a `StrEnum`: the stored JSON and the
wire keep the same strings, and a misspelt kind is a type error where it is written.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class ActorStage(StrEnum):
    """Worker lifecycle of the architecture seed."""

    INIT = "INIT"
    READY = "READY"
    RUNNING = "RUNNING"
    FINISH = "FINISH"
    FAILED = "FAILED"
    STOPPED = "STOPPED"  # stopped by the job's end while it still ran (no longer RUNNING)

    @property
    def is_terminal(self) -> bool:
        return self in (ActorStage.FINISH, ActorStage.FAILED, ActorStage.STOPPED)


class Tier(StrEnum):
    """Rungs of the failover ladder (DESIGN section 4)."""

    IN_PLACE = "in_place"
    ROLE = "role"
    JOB = "job"
    NODE = "node"
    SUB_MASTER = "sub_master"
    MASTER = "master"


class FailureKind(StrEnum):
    """What detected a failure of one actor (the monitor, a report, the failover itself)."""

    DIED = "died"
    RESTARTED = "restarted"  # Ray rebuilt it
    UNAVAILABLE = "unavailable"  # Ray is rebuilding it, for too long
    FAILED = "failed"
    ERROR_REPORT = "error_report"
    HEARTBEAT_TIMEOUT = "heartbeat_timeout"
    HANG = "hang"
    NODE_LOST = "node_lost"  # lost with another actor's node: that fault's effect
    NODE_RELAUNCH = "node_relaunch"  # on a node the ladder relaunches
    FAILOVER_FAILED = "failover_failed"  # a recovery that failed, escalated


# A failure of the actor's process: everything else on its node may have died with it.
DEATH_KINDS: frozenset[FailureKind] = frozenset(
    {FailureKind.DIED, FailureKind.RESTARTED, FailureKind.UNAVAILABLE}
)


class EventKind(StrEnum):
    """Every kind of entry on a job's event timeline. Failure kinds are event kinds too."""

    # failures (FailureKind's values)
    DIED = "died"
    RESTARTED = "restarted"
    UNAVAILABLE = "unavailable"
    FAILED = "failed"
    ERROR_REPORT = "error_report"
    HEARTBEAT_TIMEOUT = "heartbeat_timeout"
    HANG = "hang"
    NODE_LOST = "node_lost"
    NODE_RELAUNCH = "node_relaunch"
    FAILOVER_FAILED = "failover_failed"
    FAULTY_NODE = "faulty_node"
    STRAGGLER = "straggler"
    NODE_CHECK = "node_check"
    # the job
    WAITING_FOR_NODES = "waiting_for_nodes"
    STATE_STORE_UNAVAILABLE = "state_store_unavailable"
    STATE_STORE_RESTORED = "state_store_restored"
    JOB_CREATED = "job_created"
    JOB_RESUMED = "job_resumed"
    STAGE = "stage"
    ACTORS_CREATED = "actors_created"
    ROLE_FINISHED = "role_finished"
    CHANNEL_CREATED = "channel_created"
    ENDPOINT_PUBLISHED = "endpoint"
    STOP_FAILED = "stop_failed"
    CLEANUP_FAILED = "cleanup_failed"
    # recoveries
    INPLACE_RESTART = "inplace_restart"
    JOINED_RECOVERY = "joined_recovery"
    RESTART_LIMIT = "restart_limit"
    FAILOVER_STARTED = "failover_started"
    FAILOVER_JOINED = "failover_joined"
    FAILOVER_ESCALATED = "failover_escalated"
    FAILOVER_DONE = "failover_done"
    ACTORS_RESTARTING = "actors_restarting"
    ACTORS_RESTARTED = "actors_restarted"
    NODE_RELAUNCHED = "node_relaunched"
    NODE_LIMIT = "node_limit"
    MASTER_RESTARTED = "master_restarted"
    MASTER_LOST = "master_lost"  # the PrimeMaster gone for good: closed by the launcher or `dlu stop`
    KILLED = "killed"  # closed by `dlu stop` without a PrimeMaster
    RECOVERED = "recovered"
    # resizes
    RESIZE_STARTED = "resize_started"
    RESIZE_WAITING = "resize_waiting"
    RESIZE_DONE = "resize_done"
    RESIZE_FAILED = "resize_failed"
    RESIZE_TARGET = "resize_target"
    SHARDS_REQUEUED = "shards_requeued"
    ELASTIC_START = "elastic_start"
    ELASTIC_BELOW_MIN = "elastic_below_min"
    ELASTIC_REFORM_FAILED = "elastic_reform_failed"
    # auto-scaling (docs/autoscaling.md)
    AUTOSCALE_DECISION = "autoscale_decision"  # a size chosen, with the measurements behind it
    AUTOSCALE_PLAN_UNPLACEABLE = "autoscale_plan_unplaceable"  # a Brain's plan refused or unplaceable
    MEMORY_RELAUNCH = "memory_relaunch"  # an actor near its memory limit replaced with more (not a fault)
    MEMORY_RELAUNCH_DONE = "memory_relaunch_done"
    MEMORY_RELAUNCH_FAILED = "memory_relaunch_failed"
    BUNDLE_FREE = "bundle_free"  # a bundle a relaunched actor left: reserved, unused, or given back
    BUNDLE_REUSED = "bundle_reused"  # an actor seated in such a bundle instead of reserving more
    # checkpoints
    CHECKPOINT_RESTORED = "checkpoint_restored"
    CHECKPOINT_PERSISTED = "checkpoint_persisted"
    CHECKPOINT_PERSIST_FAILED = "checkpoint_persist_failed"
    CHECKPOINT_REPLICATED = "checkpoint_replicated"  # a copy to the buddy agent succeeded again
    CHECKPOINT_REPLICA_FAILED = "checkpoint_replica_failed"  # a copy to the buddy agent failed (retried)
    # progress
    STALLED = "stalled"  # no actor made progress for the stall window
    PROGRESS_RESUMED = "progress_resumed"
    # dlu debug
    MARK_UNHEALTHY = "mark_unhealthy"


FAILURE_EVENTS: frozenset[str] = frozenset(
    {
        EventKind.DIED,
        EventKind.RESTARTED,
        EventKind.UNAVAILABLE,
        EventKind.FAILED,
        EventKind.ERROR_REPORT,
        EventKind.HEARTBEAT_TIMEOUT,
        EventKind.HANG,
        EventKind.FAULTY_NODE,
        EventKind.INPLACE_RESTART,  # a training process failed: its message has the process' error
    }
)
"""A detected failure: what `dlu status` names as a job's root cause (its first failure)."""

RECOVERY_OPENERS: frozenset[str] = frozenset(
    {
        EventKind.DIED,
        EventKind.FAILED,
        EventKind.ERROR_REPORT,
        EventKind.HEARTBEAT_TIMEOUT,
        EventKind.HANG,
        EventKind.ACTORS_RESTARTING,
        EventKind.FAILOVER_STARTED,
        EventKind.INPLACE_RESTART,
    }
)
"""Events that open a recovery the timeline can time: a detected failure, or the start of a
restart. Events that announce a recovery with no completion event of their own
("master_restarted") are left out rather than reported as never recovered."""

RECOVERED_EVENTS: frozenset[str] = frozenset(
    {EventKind.ACTORS_RESTARTED, EventKind.FAILOVER_DONE, EventKind.RECOVERED}
)
"""Events that say a recovery is complete."""

RECOVERY_EVENTS: frozenset[str] = frozenset(
    {
        EventKind.INPLACE_RESTART,
        EventKind.FAILOVER_DONE,
        EventKind.FAILOVER_FAILED,
        EventKind.NODE_RELAUNCHED,
        EventKind.MASTER_RESTARTED,
        EventKind.RESTART_LIMIT,
        EventKind.JOB_RESUMED,
    }
)
"""What each rung of the ladder did, as `dlu status` lists it."""


class InPlaceVerdict(StrEnum):
    """The PrimeMaster's answer to a SubMaster whose rank's training process failed."""

    RESTART = "restart"  # a fault of its own: counted, every rank restarts in place
    JOIN = "join"  # recovered by the recovery in flight (or about to start): no restart of its own
    STOP = "stop"  # over the role's limit: the job stops


@dataclass(frozen=True)
class InPlaceDecision:
    """`counted`: the report is a fault of its own (counted on its rank) even when it JOINs,
    because one recovery in flight recovers it too (causality, docs/failover.md)."""

    verdict: InPlaceVerdict
    reason: str = ""
    counted: bool = False
