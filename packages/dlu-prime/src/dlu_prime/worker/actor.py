"""The generic worker actor: the seed's lifecycle hooks around a user entrypoint.

INIT (constructed) -> READY (setup: env set, entrypoint imported) -> RUNNING (start) ->
FINISH / FAILED. The PrimeMaster polls `status()`; user code runs in its own thread so the
actor keeps answering status and RPC calls while it works.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from dlu_api.spec.models import LogsSettings
from dlu_api.vocabulary import ActorStage
from dlu_prime.runtime.context import Health, WorkerContext, set_current_worker
from dlu_prime.stats.usage import UsageSampler
from dlu_prime.worker.entrypoint import LoadedEntrypoint, Outcome, Result, prepend_sys_path
from dlu_prime.worker.rank_logs import RankOutput, redirect_this_process

logger = logging.getLogger(__name__)

RPC_READY_TIMEOUT_S = 600.0


@dataclass(frozen=True)
class WorkerInfo:
    """Everything a worker needs to know about itself; sent once at creation."""

    job: str
    role: str
    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    node_rank: int
    actor_name: str
    entrypoint: str
    env: dict[str, str] = field(default_factory=dict[str, str])
    config: dict[str, Any] = field(default_factory=dict[str, Any])
    workdir: str | None = None
    role_sizes: dict[str, int] = field(default_factory=dict[str, int])
    role_json: str = ""  # the role's spec, for actors that need more than the entrypoint
    run_id: str = ""
    health_json: str = ""  # the job's health settings, for actors that watch something themselves
    logs_json: str = ""  # the job's logs settings (dlu_api.spec.models.LogsSettings)

    def logs_settings(self) -> LogsSettings:
        return LogsSettings.model_validate_json(self.logs_json) if self.logs_json else LogsSettings()


def _ray_identity() -> tuple[str | None, list[str], bool]:
    """(node id, assigned GPU ids, reconstructed by Ray) of this actor."""
    import ray

    context = ray.get_runtime_context()
    node_id: str | None = context.get_node_id()
    gpu_ids = [str(g) for g in ray.get_gpu_ids()]
    return node_id, gpu_ids, was_reconstructed()


def was_reconstructed() -> bool:
    """Whether Ray restarted this actor (read through dlu_prime.ray_private: see why there)."""
    from dlu_prime import ray_private

    return ray_private.actor_was_restarted()


def _report_restarted(job: str, actor: str, node_id: str | None) -> None:
    """The seed's RESTARTED report: tell the PrimeMaster at once (it also sees it when polling)."""
    import ray

    from dlu_prime.naming import NAMESPACE, master_name

    try:
        master = ray.get_actor(master_name(job), namespace=NAMESPACE)
        master.report_restarted.remote(actor, node_id)
    except Exception as exc:  # the PrimeMaster may be restarting too; its poll finds us
        logger.warning("%s: could not report the restart to the PrimeMaster: %s", actor, exc)


class WorkerActor:
    """Base of every DLU actor; SubMasters subclass it and override `check_child`."""

    # A simple role's rank is this process: its stdout/stderr go to the rank's log files.
    redirects_own_output = True

    def __init__(self, info: WorkerInfo) -> None:
        self.info = info
        self.stage = ActorStage.INIT
        self.result: Result | None = None
        self.health = Health(on_report=self._wake_master)
        self.entry: LoadedEntrypoint | None = None
        self.started_at: float | None = None
        self.finished_at: float | None = None
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._rpc_ready = threading.Event()  # set once the user's instance exists
        self.node_id, self.gpu_ids, self.reconstructed = _ray_identity()
        self._usage = UsageSampler()
        if self.redirects_own_output:
            attempt = "restarted by Ray" if self.reconstructed else "actor started"
            output = RankOutput.of(
                info.logs_settings(),
                job=info.job,
                run_id=info.run_id,
                role=info.role,
                rank=info.rank,
                attempt=attempt,
            )
            redirect_this_process(output)
        if self.reconstructed:
            _report_restarted(info.job, info.actor_name, self.node_id)
        os.environ.update(info.env)
        prepend_sys_path(info.workdir)
        if info.workdir and os.path.isdir(info.workdir):
            os.chdir(info.workdir)
        set_current_worker(
            WorkerContext(
                job=info.job,
                role=info.role,
                rank=info.rank,
                world_size=info.world_size,
                local_rank=info.local_rank,
                local_world_size=info.local_world_size,
                node_rank=info.node_rank,
                actor_name=info.actor_name,
                config=info.config,
                health=self.health,
                role_sizes=info.role_sizes,
            )
        )

    @property
    def stage(self) -> ActorStage:
        return self._stage

    @stage.setter
    def stage(self, value: ActorStage) -> None:
        """An actor that ends (FINISH or FAILED) wakes the PrimeMaster: its monitoring pass sees
        the end at once, not up to `health.monitor_interval_s` later (the job's last second)."""
        ended = value in (ActorStage.FINISH, ActorStage.FAILED) and getattr(self, "_stage", None) is not value
        self._stage = value
        if ended:
            self._wake_master()

    def _wake_master(self) -> None:
        import ray

        from dlu_prime.naming import NAMESPACE, master_name

        if not ray.is_initialized():
            return
        try:
            # Looked up once (a GCS round trip each time, on the path of a restart's first step);
            # a handle stays valid across the PrimeMaster's restarts.
            master = getattr(self, "_master_handle", None)
            if master is None:
                master = self._master_handle = ray.get_actor(master_name(self.info.job), namespace=NAMESPACE)
            master.wake.remote()
        except Exception as exc:  # the poll still finds the report
            self._master_handle = None
            logger.debug("%s: could not wake the PrimeMaster: %s", self.info.actor_name, exc)

    # lifecycle hooks -------------------------------------------------------------------------
    def identity(self) -> dict[str, Any]:
        """Node and GPUs Ray gave this actor; the scheduler needs them to set device env."""
        return {"node_id": self.node_id, "gpu_ids": self.gpu_ids, "reconstructed": self.reconstructed}

    def setup(self, env: dict[str, str] | None = None) -> dict[str, Any]:
        """Self check: apply the device env and import the entrypoint. Raises if it cannot run."""
        if env:
            os.environ.update(env)
        self.entry = self.load_entrypoint()
        self._rpc_ready.set()
        self.stage = ActorStage.READY
        return self.identity()

    def load_entrypoint(self) -> LoadedEntrypoint:
        return LoadedEntrypoint(self.info.entrypoint, self.info.workdir)

    def check_child(self) -> None:
        """SubMasters check their workers here (e.g. a node check); plain workers have none."""

    def start(self) -> None:
        if self.stage is ActorStage.RUNNING:
            return
        if self.entry is None:
            raise RuntimeError(f"{self.info.actor_name}: start() before setup()")
        self.stage = ActorStage.RUNNING
        self.started_at = time.time()
        self.health.pause()  # judged by beats only once user code sends one
        if self.entry.is_service:
            return  # answers RPCs until stopped
        self._thread = threading.Thread(target=self._main, name=f"dlu-{self.info.actor_name}", daemon=True)
        self._thread.start()

    def recover_running(self) -> None:
        """After a SubMaster restart: get back to RUNNING without disturbing healthy workers."""
        self.start()

    def _main(self) -> None:
        assert self.entry is not None
        result = self.entry.run()
        self.finished_at = time.time()
        self.result = result
        self.stage = ActorStage.FINISH if result.outcome is Outcome.SUCCESS else ActorStage.FAILED
        if result.error:
            logger.error("%s failed:\n%s", self.info.actor_name, result.error)

    def stop(self) -> None:
        """Ask user code to stop (cooperative); the scheduler kills the actor afterwards. A
        worker whose code already returned has nothing to stop: its hook is not called."""
        self._stop.set()
        if self.stage.is_terminal:
            return
        stop_hook = getattr(self.entry.instance, "stop", None) if self.entry else None
        if callable(stop_hook):
            try:
                stop_hook()
            except Exception:
                logger.exception("%s: user stop() raised", self.info.actor_name)

    # debugging (the health seed's endpoints, reached through the PrimeMaster) -----------------
    def mark_unhealthy(self, message: str) -> None:
        """Report an error as if the worker had noticed a failure itself (tests a recovery)."""
        self.health.report(message)

    def set_step(self, step: int) -> int:
        """Set the training step. A user instance with `set_step` is told, and its beats carry
        the new step from then on; otherwise the beats of the worker's own loop are shifted to
        go on from `step` (Health.set_step), so the next one does not undo it."""
        hook = getattr(self.entry.instance, "set_step", None) if self.entry else None
        if callable(hook):
            hook(step)
            with self.health.lock:
                self.health.step_offset = 0
                self.health.step = step
        else:
            self.health.set_step(step)
        return step

    def status(self) -> dict[str, Any]:
        """Snapshot polled by the PrimeMaster."""
        return {
            "stage": self.stage.value,
            "error": self.result.error if self.result else None,
            "started_at": self.started_at,
            "finished_at": self.finished_at,
            "node_id": self.node_id,
            "reconstructed": self.reconstructed,
            "pid": os.getpid(),
            **self.health.snapshot(),
            **self._usage.sample(self._usage_pids()),
        }

    def _usage_pids(self) -> list[int]:
        """The processes whose CPU and memory are the actor's (with their children)."""
        return [os.getpid()]

    # RPC -------------------------------------------------------------------------------------
    def call_rpc(self, method: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """Dispatch a call from a role group to an `@rpc` method of the user's class."""
        from dlu_prime.runtime.rpc import find_rpc_method

        # A caller may be faster than our start (e.g. an elastic class role still in its
        # rendezvous): wait for the instance rather than fail the call.
        self._rpc_ready.wait(RPC_READY_TIMEOUT_S)
        if self.entry is None or self.entry.instance is None:
            raise RuntimeError(
                f"{self.info.actor_name} runs {self.info.entrypoint!r}, which is not a class with @rpc methods"
            )
        return find_rpc_method(self.entry.instance, method)(*args, **kwargs)
