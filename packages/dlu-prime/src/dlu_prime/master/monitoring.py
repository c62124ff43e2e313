"""One monitoring pass of the PrimeManager, the observing side: poll the actors, keep what
the judgements need between passes (liveness, since when elastic workers are gone, the stall
memory), hand the pass to the decision core (`PassObserved`), feed the runtime statistics and
auto-scaling (`autoscale.driver`: `AutoscaleObserved`), then, on a quiet pass, the stall notice
(`StallObserved`). Nothing here decides."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

from dlu_api.status import JobStage
from dlu_prime.autoscale.driver import Autoscaler
from dlu_prime.master.core.events import Event, PassObserved
from dlu_prime.master.elastic_resize import ElasticResizer
from dlu_prime.master.lifecycle import gone
from dlu_prime.master.liveness import Liveness
from dlu_prime.master.metrics import JobMetrics
from dlu_prime.master.monitor import Assessment, Failure, assess
from dlu_prime.master.ports import StatePort
from dlu_prime.master.resize import resizing
from dlu_prime.master.stall_watch import StallWatch
from dlu_prime.scheduler.base import ActorObservation, Scheduler


class Monitoring:
    def __init__(
        self,
        port: StatePort,
        scheduler: Scheduler,
        clock: Callable[[], float],
        handle: Callable[[Event], Any],
        has_extension: Callable[[], bool],
        metrics: Callable[[], JobMetrics | None],
    ) -> None:
        self._port = port
        self._scheduler = scheduler
        self._clock = clock
        self._handle = handle
        self._has_extension = has_extension  # an Extension can relaunch nodes (tier 4)
        self._metrics = metrics  # the Ray metrics, once the PrimeMaster actor set them
        self.liveness = Liveness()
        self.elastic = ElasticResizer(port, handle)  # elastic roles: since when workers are gone
        self.stall = StallWatch()  # "nothing moves": reported, never acted on
        self.autoscale = Autoscaler(port, handle, clock, metrics)  # statistics; auto-scaling
        self._injected: list[Failure] = []  # reports made through the PrimeMaster (dlu debug)
        self._lock = threading.Lock()

    def inject(self, failures: Sequence[Failure]) -> None:
        """Failures reported through the PrimeMaster, judged at the next pass."""
        with self._lock:
            self._injected.extend(failures)

    def step(self, observations: dict[str, ActorObservation], now: float) -> Assessment:
        """Observations -> judgement, pure but for the liveness memory it keeps (when each
        actor's beats and steps last moved, on this clock)."""
        live = self.liveness
        live.track(observations, now)
        result = assess(self._port.state(), observations, now, live.steps, live.unavailable, live.beats)
        with self._lock:
            injected, self._injected = self._injected, []
        actors = self._port.state().actors
        injected = [f for f in injected if f.actor in actors]  # not one a resize removed meanwhile
        return replace(result, failures=(*result.failures, *injected)) if injected else result

    def once(self) -> Assessment:
        """Poll, judge (`step`), then the core decides (record, recover, resize, or end the job
        when every driver role has finished). Returns the pass as the core judged it."""
        state = self._port.state()
        busy = resizing(state)  # being created or stopped by a resize: not judged
        observations = self._scheduler.poll([n for n in state.actors if n not in busy])
        now = self._clock()
        result = self.step(observations, now)
        gone_since = self.elastic.watch(result, observations, now)
        lost = frozenset(name for name, o in observations.items() if gone(o) or o.unavailable)
        judged = self._handle(PassObserved(result, lost, self._has_extension(), gone_since))
        if isinstance(judged, Assessment):
            result = judged  # failures of possibly lost elastic nodes were held out of it
        metrics = self._metrics()
        if metrics is not None:
            ages = {
                n: now - o.last_heartbeat for n, o in observations.items() if o.last_heartbeat is not None
            }
            metrics.observe_state(self._port.state(), ages)
        if self._port.state().stage is JobStage.RUNNING:
            self.autoscale.after_pass(observations, now)
        if not result.failures and not result.all_drivers_finished:
            self.stall.check(self._port.state(), self.liveness, self._handle, observations, now)
        return result
