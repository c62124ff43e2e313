"""SubMasters: an optional per-role master that drives the role's workers (e.g. ElasticMaster).

A SubMaster keeps no state of its own: everything it needs comes from the job spec and the
workers, so after a restart the PrimeMaster simply sets it up again and asks it to
`recover_running`. User SubMasters subclass `SubMaster`; `SubMasterActor` hosts them, so the
user's class is imported inside the actor, after the job's working directory is on sys.path.
"""

from __future__ import annotations

import importlib
import logging
import threading
from typing import Any

from dlu_api.spec.models import HealthSettings, RoleSpec
from dlu_api.vocabulary import ActorStage, EventKind
from dlu_prime.naming import NAMESPACE, actor_name, endpoint_key, master_name
from dlu_prime.worker.actor import WorkerActor, WorkerInfo
from dlu_prime.worker.entrypoint import EntrypointError

logger = logging.getLogger(__name__)


class SubMaster:
    """Base class of a role's SubMaster. Override the hooks you need; defaults drive all workers."""

    def __init__(
        self, job: str, role: str, world_size: int, config: dict[str, Any], spec: RoleSpec | None = None
    ) -> None:
        self.job = job
        self.role = role
        self.world_size = world_size
        self.config = config
        self.spec = spec

    def record_event(self, kind: EventKind, message: str) -> None:
        """Add to the job's event timeline (kept by the PrimeMaster)."""
        import ray

        master = ray.get_actor(master_name(self.job), namespace=NAMESPACE)
        ray.get(master.record_event.remote(kind, message, self.role), timeout=30)

    def publish(self, value: dict[str, str]) -> None:
        """Publish this SubMaster's endpoint for its workers (saved by the PrimeMaster)."""
        import ray

        master = ray.get_actor(master_name(self.job), namespace=NAMESPACE)
        ray.get(master.publish.remote(endpoint_key(self.role), value), timeout=30)

    def role_finished(self) -> bool:
        """Whether every worker of this role had finished when this SubMaster was set up: true
        only for a replacement (tier 5) of a role whose training is over, which must leave its
        workers finished instead of starting them again."""
        import ray

        master = ray.get_actor(master_name(self.job), namespace=NAMESPACE)
        return bool(ray.get(master.role_finished.remote(self.role), timeout=30))

    @property
    def workers(self) -> list[Any]:
        """Actor handles of the role's workers, in rank order (found by name: restarts included)."""
        import ray

        return [
            ray.get_actor(actor_name(self.job, self.role, r), namespace=NAMESPACE)
            for r in range(self.world_size)
        ]

    def call_workers(self, method: str, *args: Any, timeout: float | None = 120.0) -> list[Any]:
        import ray

        return list(ray.get([getattr(w, method).remote(*args) for w in self.workers], timeout=timeout))

    def setup(self) -> None:
        """Self check of the SubMaster itself."""

    def check_child(self) -> None:
        """Check the workers before the job starts (default: all READY)."""
        stages = [s["stage"] for s in self.call_workers("status")]
        bad = [f"rank {r}: {s}" for r, s in enumerate(stages) if s != ActorStage.READY.value]
        if bad:
            raise RuntimeError(f"role {self.role}: workers not ready ({', '.join(bad)})")

    def start(self) -> None:
        """Start the workers (default: all of them)."""
        self.call_workers("start")

    def recover_running(self) -> None:
        """Back to RUNNING after this SubMaster restarted; must not disturb healthy workers.

        The default starts every worker; `start` is idempotent on workers, so running ones
        carry on untouched."""
        self.start()

    def restart_actors(self, names: list[str], reason: str) -> None:
        """Ask the PrimeMaster to replace these workers (it counts, limits, and waits until
        they are ready)."""
        import ray

        master = ray.get_actor(master_name(self.job), namespace=NAMESPACE)
        ray.get(master.restart_actors.remote(names, reason))

    def failover(self, names: list[str], reason: str) -> None:
        """Role-level failover (tier 2): the PrimeMaster saw these workers fail. Restart them
        through the PrimeMaster, then start them again; override to restart training too."""
        import ray

        self.restart_actors(names, reason)
        ray.get([ray.get_actor(n, namespace=NAMESPACE).start.remote() for n in names], timeout=120)

    def resize_members(self, ranks: list[int], new_ranks: list[int], timeout_s: float) -> int | None:
        """The role's workers are now these ranks (an elastic resize, saved by the PrimeMaster;
        `new_ranks` are set up but not started): re-form training around them, in place. Returns
        the world size training runs at again, or None when it did not within `timeout_s`.
        Default: start the new ranks; nothing to re-form."""
        import ray

        ray.get(
            [
                ray.get_actor(actor_name(self.job, self.role, r), namespace=NAMESPACE).start.remote()
                for r in new_ranks
            ],
            timeout=timeout_s,
        )
        return len(ranks)

    def check_nodes(self, ranks: list[int]) -> None:
        """Check the nodes of these new ranks before they join (default: nothing)."""

    def stop(self) -> None:
        """Called when the job stops."""

    def serving(self) -> bool:
        """Whether this SubMaster still does its job (e.g. its server answers). The actor beats
        only while it does, so a SubMaster that stopped serving is found stale and restarted."""
        return True


def load_sub_master_class(path: str) -> type[SubMaster]:
    """Import 'module:Class' and check it is a SubMaster.

    Raises:
        EntrypointError: missing, not a class, or not a SubMaster subclass.
    """
    module_name, _, attr = path.partition(":")
    try:
        target: Any = importlib.import_module(module_name)
        for part in attr.split("."):
            target = getattr(target, part)
    except (ImportError, AttributeError) as exc:
        raise EntrypointError(f"sub_master {path!r} cannot be loaded: {exc}") from exc
    if not (isinstance(target, type) and issubclass(target, SubMaster)):
        raise EntrypointError(f"sub_master {path!r} is not a subclass of dlu_prime.SubMaster")
    return target


class SubMasterActor(WorkerActor):
    """Hosts a role's SubMaster; `info.entrypoint` is the SubMaster class path."""

    redirects_own_output = False  # not a rank: its output stays in Ray's worker log

    def __init__(self, info: WorkerInfo) -> None:
        super().__init__(info)
        self.impl: SubMaster | None = None
        health = (
            HealthSettings.model_validate_json(info.health_json) if info.health_json else HealthSettings()
        )
        self._beat_interval_s = health.heartbeat_interval_s
        self._beating: threading.Thread | None = None

    def setup(self, env: dict[str, str] | None = None) -> dict[str, Any]:
        cls = load_sub_master_class(self.info.entrypoint)
        spec = RoleSpec.model_validate_json(self.info.role_json) if self.info.role_json else None
        self.impl = cls(
            self.info.job, self.info.role, self.info.role_sizes[self.info.role], self.info.config, spec
        )
        self.impl.setup()
        self.stage = ActorStage.READY
        return self.identity()

    def _impl(self) -> SubMaster:
        if self.impl is None:
            raise RuntimeError(f"{self.info.actor_name}: called before setup()")
        return self.impl

    def check_child(self) -> None:
        self._impl().check_child()

    def start(self) -> None:
        self._impl().start()
        self.stage = ActorStage.RUNNING
        self._start_beating()

    def recover_running(self) -> None:
        self._impl().recover_running()
        self.stage = ActorStage.RUNNING
        self._start_beating()

    def _start_beating(self) -> None:
        """A SubMaster trains nothing: what proves it alive is a beat from its own loop, sent
        every heartbeat interval while `serving()` holds (a beat only at start looked stale one
        timeout later and had every healthy role "recovered" until its restart limit)."""
        self.health.beat(None, None)
        if self._beating is None:
            self._beating = threading.Thread(target=self._beat_loop, name="dlu-submaster-beat", daemon=True)
            self._beating.start()

    def _beat_loop(self) -> None:
        while not self._stop.wait(self._beat_interval_s):
            try:
                serving = self._impl().serving()
            except Exception:
                logger.exception("%s: serving() raised", self.info.actor_name)
                serving = False
            if serving:
                self.health.beat(None, None)

    def failover(self, names: list[str], reason: str) -> None:
        self._impl().failover(names, reason)

    def resize_members(self, ranks: list[int], new_ranks: list[int], timeout_s: float) -> int | None:
        return self._impl().resize_members(ranks, new_ranks, timeout_s)

    def check_nodes(self, ranks: list[int]) -> None:
        self._impl().check_nodes(ranks)

    def stop(self) -> None:
        self._stop.set()
        if self.impl is not None:
            self.impl.stop()

    def call_rpc(self, method: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        from dlu_prime.runtime.rpc import find_rpc_method

        return find_rpc_method(self._impl(), method)(*args, **kwargs)
