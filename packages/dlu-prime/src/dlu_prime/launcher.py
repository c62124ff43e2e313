"""Launching a job on a connected Ray: checks, PrimeMaster creation, waiting, and cleanup.

`dlu run` (embedded Ray), `Job.submit()` and the cluster entrypoint `python -m dlu_prime launch`
all go through these functions, so a job behaves the same wherever it was started.
"""

from __future__ import annotations

import importlib
import logging
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

import ray
from ray.exceptions import GetTimeoutError, RayActorError, RayError, RayTaskError

from dlu_api.errors import JobNameTakenError, Problem, SpecError
from dlu_api.spec.autoscale_settings import brain_url
from dlu_api.spec.models import JobSpec
from dlu_api.spec.rules import ensure_valid
from dlu_api.status import EventCursor, JobEvent, JobStage, JobStatus
from dlu_prime import preflight as checks
from dlu_prime.master.job_status import job_status as stored_job_status
from dlu_prime.master.lost import close_lost_job
from dlu_prime.master.schema import SchemaVersionError, refuse_newer
from dlu_prime.master.state import MAX_EVENTS, JobState
from dlu_prime.naming import NAMESPACE, master_name
from dlu_prime.scheduler.cleanup import remove_job_resources
from dlu_prime.scheduler.placement import master_options
from dlu_prime.state.base import StateStoreError, create_state_store

logger = logging.getLogger(__name__)

StatusCallback = Callable[[JobStatus], None]


# checks before anything starts ------------------------------------------------------------------
def preflight(spec: JobSpec, workdir: str | None, code_checked: bool = False) -> None:
    """Reject a job that cannot run, before any actor or placement group exists: the checks that
    need no Ray (`dlu_prime.preflight`; `code_checked`: a local run passed them before starting
    Ray, so they are not run again) and the job's resources against the connected cluster's.

    Raises:
        SpecError: every problem found.
    """
    ensure_valid(spec)
    problems = _cluster_resource_problems(spec)
    if not code_checked:
        problems += checks.code_problems(spec, workdir)
    if problems:
        raise SpecError(problems)


def _cluster_resource_problems(spec: JobSpec) -> list[Problem]:
    total: dict[str, float] = {str(k): float(v) for k, v in ray.cluster_resources().items()}
    node_max: dict[str, float] = {}
    for node in ray.nodes():
        if node.get("Alive"):
            for name, amount in (node.get("Resources") or {}).items():
                node_max[name] = max(node_max.get(name, 0.0), float(amount))
    demand = checks.job_demand(spec)
    have = {name: total.get(name, 0.0) for name in demand.total}  # a resource it lacks: 0
    return checks.resource_problems(spec, have, node_max, where="the cluster")


# master lifecycle -------------------------------------------------------------------------------
MASTER_MODULE = "dlu_prime.master.actor"


def prefetch_master() -> threading.Thread:
    """Import the PrimeMaster's modules (`ray.remote` needs its class here: 0.2 to 0.4 s of CPU)
    in a thread, while this process starts Ray, which mostly waits for its processes meanwhile.
    `submit_job`'s own import finds them done, or waits for the thread's (the module's import
    lock); one that failed fails there again. Ray's start imports none of these modules."""
    thread = threading.Thread(
        target=importlib.import_module, args=(MASTER_MODULE,), name="dlu-import-master", daemon=True
    )
    thread.start()
    return thread


def get_master(job: str) -> Any | None:
    try:
        return ray.get_actor(master_name(job), namespace=NAMESPACE)
    except ValueError:
        return None


def stored_status(job: str, store_name: str, options: dict[str, Any]) -> JobStatus | None:
    """The job's last saved status in its state store; None if there is none or no store."""
    try:
        store = create_state_store(store_name, options)
        try:
            stored = store.get(job)
        finally:
            store.close()
    except StateStoreError:
        return None
    if stored is None:
        return None
    try:
        return stored_job_status(JobState.loads(stored.data))
    except ValueError:
        return None


def submit_job(
    spec: JobSpec, workdir: str | None = None, resume: bool = False, code_checked: bool = False
) -> Any:
    """Check the job, clear leftovers of an earlier run of the same name, create its PrimeMaster.
    `code_checked`: the caller has just passed the checks that need no Ray (`preflight`).

    Raises:
        SpecError: the job cannot run here (nothing was created).
        JobNameTakenError: a job of this name is still running.
    """
    preflight(spec, workdir, code_checked)
    if resume:
        _check_resumable(spec)
    else:
        _check_replaceable(spec)
    old = get_master(spec.name)
    if old is not None:
        try:
            old_status = JobStatus.model_validate(ray.get(old.status.remote(0), timeout=10))
        except (RayError, GetTimeoutError):
            old_status = None
        if old_status is not None and old_status.stage is not JobStage.STOPPED:
            raise JobNameTakenError(
                f"job {spec.name!r} is still {old_status.stage.value}; stop it with `dlu stop {spec.name}` "
                "or choose another name."
            )
    remove_job_resources(spec.name, include_master=True)
    spec = with_brain_url(spec)
    from dlu_prime.master.actor import PrimeMaster  # done by now where `prefetch_master` ran

    master_class = ray.remote(PrimeMaster)
    master = master_class.options(  # pyright: ignore[reportUnknownMemberType]
        name=master_name(spec.name),
        namespace=NAMESPACE,
        lifetime="detached",
        max_restarts=spec.limits.master_max_restart,
        max_concurrency=16,
        **master_options(spec),
    ).remote(spec.model_dump_json(), workdir, resume)
    logger.info("job %s: PrimeMaster created%s", spec.name, " to resume it" if resume else "")
    return master


def with_brain_url(spec: JobSpec) -> JobSpec:
    """A cluster-mode spec that names no Brain gets this process's $DLU_BRAIN_URL, so the
    PrimeMaster (on whatever node Ray puts it) reports to the Brain the job was launched with."""
    url = brain_url(spec.autoscale)  # preflight refused a cluster-mode job without one
    if url is None or spec.autoscale.brain_url == url:
        return spec
    return spec.model_copy(update={"autoscale": spec.autoscale.model_copy(update={"brain_url": url})})


def _check_replaceable(spec: JobSpec) -> None:
    """Refuse, before creating anything, to run over the state a newer dlu-prime stored under this
    name (the PrimeMaster checks again). A store that cannot be read now is left to it."""
    try:
        stored = create_state_store(spec.state_store.name, spec.state_store.options).get(spec.name)
    except StateStoreError as exc:
        logger.warning("job %s: could not read its stored state before the run: %s", spec.name, exc)
        return
    if stored is None:
        return
    try:
        refuse_newer(spec.name, stored.data)
    except SchemaVersionError as exc:
        raise SpecError([Problem("name", str(exc), "choose another job name, or upgrade dlu-prime")]) from exc


def _check_resumable(spec: JobSpec) -> None:
    """Say why a resume cannot work before creating anything (the PrimeMaster checks again)."""
    from dlu_prime.master.manager import resume_problem

    stored = create_state_store(spec.state_store.name, spec.state_store.options).get(spec.name)
    try:
        problem = resume_problem(spec, JobState.loads(stored.data) if stored is not None else None)
    except SchemaVersionError as exc:
        raise SpecError([Problem("name", str(exc), "resume the job with the dlu-prime that ran it")]) from exc
    if problem is not None:
        fix = (
            f"set name to a job stored in state_store {spec.state_store.name!r}, or point state_store "
            f"at the store that holds job {spec.name!r}."
        )
        raise SpecError([Problem("name", problem, fix)])


def job_status(job: str, events: int = 50) -> JobStatus | None:
    """The job's status from its PrimeMaster, with its last `events` events; None if it has none."""
    master = get_master(job)
    if master is None:
        return None
    return JobStatus.model_validate(ray.get(master.status.remote(events), timeout=30))


def wait_job(
    spec: JobSpec,
    on_update: StatusCallback | None = None,
    poll_interval_s: float = 0.5,
    on_poll: Callable[[], None] | None = None,
) -> JobStatus:
    """Follow the job until STOPPED, then remove its PrimeMaster and anything left behind.

    If the PrimeMaster dies for good (past its restart limit), the last stored state is
    reported with the reason, and the job's actors are removed by name.
    """
    last: JobStatus | None = None
    final: JobStatus | None = None
    quick = True
    timeline: list[JobEvent] = []
    cursor = EventCursor()
    while final is None:
        master = get_master(spec.name)
        if master is None:
            final = _master_lost(spec, last, "no PrimeMaster actor of this job exists")
            break
        try:
            # Only the events past the cursor: a fixed tail would miss any beyond it.
            answer = JobStatus.model_validate(ray.get(master.status.remote(0, cursor.position), timeout=30))
        except RayActorError as exc:
            if get_master(spec.name) is None:
                final = _master_lost(spec, last, f"it died and Ray did not restart it: {_first_line(exc)}")
            else:
                time.sleep(poll_interval_s)  # being reconstructed by Ray
            continue
        except GetTimeoutError:
            continue
        timeline = (timeline + cursor.take(answer.events))[-MAX_EVENTS:]
        current = answer.model_copy(update={"events": timeline})
        if on_update is not None and current != last:
            on_update(current)
        if on_poll is not None:
            on_poll()
        last = current
        if current.stage is JobStage.STOPPED:
            final = current
            _let_master_finish(master)
            break
        quick = _pause(master, poll_interval_s, quick)
    remove_job_resources(spec.name, include_master=True)
    return final


def _first_line(exc: BaseException) -> str:
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return f"{type(exc).__name__}: {lines[0] if lines else ''}"


def _pause(master: Any, seconds: float, quick: bool) -> bool:
    """Wait until the next poll on the PrimeMaster itself, so the job's end is seen at once
    rather than up to `seconds` later (`quick`: once only, so a loop that ended without
    stopping the job is polled at the usual pace). A plain sleep where it does not answer.

    Returns whether the next pause may still end early.
    """
    began = time.monotonic()
    try:
        ended = bool(ray.get(master.wait_stopped.remote(seconds), timeout=seconds + 10))
    except (RayError, GetTimeoutError):
        ended = False
    if ended and quick:
        return False
    time.sleep(max(0.0, seconds - (time.monotonic() - began)))
    return quick


def _let_master_finish(master: Any, timeout_s: float = 150.0) -> None:
    """The PrimeMaster's loop may still be writing the final state (e.g. after a store outage)."""
    try:
        ray.get(master.wait_stopped.remote(timeout_s), timeout=timeout_s + 10)
    except (RayError, GetTimeoutError):
        logger.warning("PrimeMaster did not confirm its final state was saved")


def _master_lost(spec: JobSpec, last: JobStatus | None, cause: str) -> JobStatus:
    """The job's end when its PrimeMaster is gone for good: written into its stored state
    (so later readers see it too), with the limit that was used up named when it was."""
    try:
        store = create_state_store(spec.state_store.name, spec.state_store.options)
        try:
            closed = close_lost_job(store, spec.name, cause)
        finally:
            store.close()
    except StateStoreError:
        closed = None
    if closed is not None:
        return closed
    base = last or JobStatus(name=spec.name, stage=JobStage.STOPPED)
    if base.stage is JobStage.STOPPED:
        return base
    return base.model_copy(
        update={
            "stage": JobStage.STOPPED,
            "exit_code": 1,
            "reason": f"job {spec.name} stopped because its PrimeMaster is gone ({cause}); "
            f"last stage {base.stage.value}",
        }
    )


def _ask_rebuilt(job: str, command: str, missing: str, call: Callable[[Any], Any], patience_s: float) -> Any:
    """`call(master)` on the job's PrimeMaster; one that dies with the request in flight is
    asked again, once Ray has rebuilt it, with the same request (the caller's request id makes
    it idempotent: a change it saved is not made twice, its outcome is answered), for up to
    `patience_s`.

    Raises:
        LookupError: the job has no PrimeMaster (`missing`), or it did not come back in time.
        ValueError: the PrimeMaster refused the request (its error's text).
    """
    deadline = time.monotonic() + patience_s
    while True:
        master = get_master(job)
        if master is None:
            raise LookupError(missing)
        try:
            return call(master)
        except RayTaskError as exc:
            cause = exc.cause if exc.cause is not None else exc
            raise ValueError(str(cause)) from None
        except RayActorError as exc:
            if time.monotonic() >= deadline:
                raise LookupError(
                    f"job {job!r}: its PrimeMaster did not come back to answer `dlu {command}` ({_first_line(exc)})"
                ) from None
            logger.info(
                "job %s: PrimeMaster gone during dlu %s (%s); asking again", job, command, _first_line(exc)
            )
            time.sleep(0.5)


def debug_job(
    job: str, action: str, role: str, rank: int | None = None, step: int | None = None
) -> dict[str, Any]:
    """Run a debugging call on the job's PrimeMaster (see PrimeMaster.debug); reads and
    set_step are repeatable, a mark is made once (by request id).

    Raises:
        LookupError: the job has no PrimeMaster.
        ValueError: unknown role, rank or action.
    """
    request_id = uuid.uuid4().hex
    result: dict[str, Any] = _ask_rebuilt(
        job,
        "debug",
        f"job {job!r} has no running PrimeMaster",
        lambda master: ray.get(master.debug.remote(action, role, rank, step, request_id), timeout=60),
        MASTER_REBUILD_S,
    )
    return result


MASTER_REBUILD_S = 60.0
"""How long a mutating request waits for a PrimeMaster that died to be rebuilt by Ray."""

SCALE_WAIT_S = 45.0
"""How long `dlu scale` waits for the resize to end (it goes on after; `dlu status` shows it):
below the 60 s a remote probe is given to answer (a local job's asker follows the resize)."""


def scale_job(job: str, role: str, size: int, wait_s: float = SCALE_WAIT_S) -> dict[str, Any]:
    """Resize a simple role of the running job through its PrimeMaster (see PrimeMaster.scale).
    A PrimeMaster that dies meanwhile is rebuilt by Ray and answers the same request id with its
    real outcome (never run twice).

    Raises:
        LookupError: the job has no running PrimeMaster.
        ValueError: refused (unknown role, size out of bounds, not resizable, ...); nothing changed.
    """
    request_id = uuid.uuid4().hex
    result: dict[str, Any] = _ask_rebuilt(
        job,
        "scale",
        f"job {job!r} is not running (no PrimeMaster): only a running job can be scaled",
        lambda master: ray.get(master.scale.remote(role, size, wait_s, request_id), timeout=wait_s + 30),
        wait_s + MASTER_REBUILD_S,
    )
    return result


def stop_job(job: str, reason: str = "stopped by user request") -> bool:
    """Ask the job's PrimeMaster to stop; with no PrimeMaster, remove what is left by name.

    Returns whether a PrimeMaster was found.
    """
    deadline = time.monotonic() + MASTER_REBUILD_S
    while True:
        master = get_master(job)
        if master is None:
            remove_job_resources(job, include_master=True)
            return False
        try:
            ray.get(master.stop.remote(reason), timeout=30)
        except RayActorError as exc:
            if time.monotonic() < deadline:  # being rebuilt: a stop is safe to ask again
                logger.info(
                    "job %s: PrimeMaster gone during dlu stop (%s); asking again", job, _first_line(exc)
                )
                time.sleep(0.5)
                continue
            remove_job_resources(job, include_master=True)
            return False
        except (RayError, GetTimeoutError):
            remove_job_resources(job, include_master=True)
            return False
        return True


def run_job(
    spec: JobSpec, workdir: str | None = None, on_update: StatusCallback | None = None, resume: bool = False
) -> JobStatus:
    submit_job(spec, workdir, resume)
    return wait_job(spec, on_update)
