"""Stopping a job at once: what a second Ctrl-C on `dlu run` does.

A clean stop asks the PrimeMaster, which asks every actor to stop and gives them time (seconds
per actor that does not answer). Stopping at once gives nobody time: the PrimeMaster is killed
first (so it restarts nothing while its actors die), then every actor and placement group of
the job; a training process dies with its actor (see dlu_prime.zygote.die_with_requester). The
job's end is then written into its stored state, since no PrimeMaster is left to write it.
"""

from __future__ import annotations

import logging
import time

import ray
from ray.exceptions import RayError

from dlu_api.spec.models import JobSpec
from dlu_api.status import JobStage, JobStatus
from dlu_api.vocabulary import ActorStage
from dlu_prime.job_files import ended_roles
from dlu_prime.launcher import get_master
from dlu_prime.master.lifecycle import EXIT_STOPPED
from dlu_prime.master.lost import close_killed_job
from dlu_prime.scheduler.cleanup import remove_job_resources
from dlu_prime.state.base import StateStoreError, create_state_store

logger = logging.getLogger(__name__)


def kill_job(
    spec: JobSpec, last: JobStatus | None, reason: str, exit_code: int = EXIT_STOPPED, timeout_s: float = 10.0
) -> JobStatus:
    """Kill the job's PrimeMaster, actors and placement groups without waiting for them to
    stop; the job's final status (from its stored state, else `last` closed with `reason`)."""
    master = get_master(spec.name)
    if master is not None:
        try:
            ray.kill(master, no_restart=True)
        except (RayError, ValueError) as exc:
            logger.warning("job %s: killing its PrimeMaster failed: %s", spec.name, exc)
        deadline = time.monotonic() + timeout_s
        while get_master(spec.name) is not None and time.monotonic() < deadline:
            time.sleep(0.05)
    removed = remove_job_resources(spec.name, include_master=True)
    logger.info("job %s stopped at once: %d actor(s) and placement group(s) removed", spec.name, removed)
    try:
        store = create_state_store(spec.state_store.name, spec.state_store.options)
        try:
            closed = close_killed_job(store, spec.name, reason, exit_code)
        finally:
            store.close()
    except StateStoreError as exc:
        logger.warning("job %s: its state store is unreachable: %s", spec.name, exc)
        closed = None
    if closed is not None:
        return closed
    return killed_status(last or JobStatus(name=spec.name, stage=JobStage.STOPPING), reason, exit_code)


def killed_status(last: JobStatus, reason: str, exit_code: int) -> JobStatus:
    """`last` ended as a job stopped at once: STOPPED, and no actor left RUNNING or READY.
    A status already STOPPED stays as it is (it ended before it was killed)."""
    if last.stage is JobStage.STOPPED:
        return last
    return last.model_copy(
        update={
            "stage": JobStage.STOPPED,
            "exit_code": exit_code,
            "reason": reason,
            "roles": ended_roles(last.roles, ActorStage.STOPPED.value),
        }
    )
