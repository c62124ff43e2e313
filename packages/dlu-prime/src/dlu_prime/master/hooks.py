"""What reacts to the PrimeManager's state changes: the log and the Ray metrics. Each hook sees
every applied change with the events it recorded; a failing hook never breaks the job."""

from __future__ import annotations

import logging
from typing import Protocol

from dlu_api.status import JobEvent
from dlu_prime.master.changes import Change, FailoverEnded, NodesRelaunched, StageChanged
from dlu_prime.master.metrics import JobMetrics
from dlu_prime.master.state import JobState


class HookHost(Protocol):
    """What a hook reads: the job's state and its metrics (the PrimeManager has both)."""

    state: JobState
    metrics: JobMetrics | None


logger = logging.getLogger("dlu_prime.master.manager")  # where stage changes were always logged


def log_stage(manager: HookHost, change: Change, events: list[JobEvent]) -> None:
    if isinstance(change, StageChanged):
        for event in events:
            logger.info("job %s: %s", manager.state.job, event.message)


def failover_metrics(manager: HookHost, change: Change, events: list[JobEvent]) -> None:
    """Durations of the recoveries the PrimeManager runs: role, SubMaster and job failovers
    (their end) and node relaunches. The in-place tier is timed by the ElasticMaster that runs
    it, the master tier by the rebuilt PrimeMaster."""
    if manager.metrics is None:
        return
    if isinstance(change, FailoverEnded) and change.error is None:
        tier = change.record.tier.value
    elif isinstance(change, NodesRelaunched):
        tier = "node"
    else:
        return
    for event in events:
        if event.duration_s is not None:
            manager.metrics.failover_done(tier, event.duration_s)
