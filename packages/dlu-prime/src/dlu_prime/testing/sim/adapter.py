"""The one place the simulation touches the PrimeManager: construction, the loop's turn, and
what SubMasters, ranks and the CLI ask of it. Where the manager grows a façade method of the
same name (the decision-core refactor), it is preferred over today's helper object.

The state writer's probe thread (it waits for a store that is back) is replaced by the
simulation's own step (`store_back`), so a run stays single-threaded and replayable.
"""

from __future__ import annotations

from collections.abc import Callable

from dlu_api.spec.models import JobSpec
from dlu_api.status import JobStage
from dlu_api.vocabulary import InPlaceDecision
from dlu_prime.master.manager import PrimeManager
from dlu_prime.scheduler.base import Scheduler
from dlu_prime.state.base import StateStore

Clock = Callable[[], float]


def _quiet(manager: PrimeManager) -> PrimeManager:
    """No probe thread: the simulation tells the writer when the store answers again."""
    manager.writer._start_probe = lambda job: None  # pyright: ignore[reportPrivateUsage]
    return manager


def create(spec: JobSpec, scheduler: Scheduler, store: StateStore, clock: Clock) -> PrimeManager:
    return _quiet(PrimeManager.create(spec, scheduler, store, clock, None))


def self_recover(spec: JobSpec, scheduler: Scheduler, store: StateStore, clock: Clock) -> PrimeManager:
    manager = PrimeManager.self_recover(spec, scheduler, store, clock, None)
    assert manager is not None, "nothing stored to recover from"
    return _quiet(manager)


def resume(spec: JobSpec, scheduler: Scheduler, store: StateStore, clock: Clock) -> PrimeManager:
    """`dlu resume`: a job-level restart of the stored run."""
    return _quiet(PrimeManager.resume(spec, scheduler, store, clock, None))


def store_back(manager: PrimeManager) -> None:
    """The probe's finding: the store answers again (the loop's next flush writes)."""
    if manager.writer.unsaved:
        manager.writer._reachable.set()  # pyright: ignore[reportPrivateUsage]


def synced(manager: PrimeManager) -> bool:
    """Whether the stored document should equal the state in memory."""
    return not manager.writer.unsaved and not manager.writer.dirty


def turn(manager: PrimeManager, resumed: bool) -> None:
    """One turn of `PrimeManager.run`'s loop: the stage it is in, one step further. `resumed`:
    the first turn of a rebuilt PrimeMaster (it finishes a saved failover first)."""
    stage = manager.state.stage
    if stage is JobStage.INIT:
        manager.prepare()
        stage = manager.state.stage
    if stage is JobStage.READY:
        manager.start()
        return
    if stage is JobStage.RUNNING:
        if resumed:  # (PrimeManager.resume is `dlu resume`, a classmethod: not this one)
            manager.resume_in_flight()
            if manager.state.stage is not JobStage.RUNNING:
                return
        manager.flush()
        manager.resizer.resume()
        manager.elastic.tick(manager.clock())
        manager.monitor_once()
        return
    if stage is JobStage.STOPPING:
        # stop, clean up, STOPPED; the runner calls this only with the store up
        manager.writer._reachable.set()  # pyright: ignore[reportPrivateUsage]
        manager.run()


def restart_actors(manager: PrimeManager, names: list[str], reason: str) -> None:
    manager.restart_actors(names, reason)


def note_inplace_restart(
    manager: PrimeManager,
    role: str,
    message: str,
    agent: str,
    error: str,
    recovered: bool = False,
    report_id: str | None = None,
) -> InPlaceDecision:
    return manager.note_inplace_restart(role, message, agent, error, recovered, report_id)


def scale(manager: PrimeManager, role: str, size: int, request_id: str) -> str:
    """`dlu scale` as the PrimeMaster actor serves it: a request id seen before is answered from
    what it came to (never run twice). 'began', 'known' or 'nothing' (already that size).

    Raises:
        ScaleError: refused (the job is busy, the size out of range, ...).
    """
    if manager.resizer.known(request_id) is not None:
        return "known"
    plan = manager.request_scale(role, size, request_id=request_id)
    return "nothing" if plan.old_size == plan.new_size else "began"


def mark_unhealthy(manager: PrimeManager, names: list[str], request_id: str) -> bool:
    return manager.mark_unhealthy(names, "marked unhealthy (sim)", request_id)


def request_stop(manager: PrimeManager, reason: str) -> None:
    manager.request_stop(reason)
