"""Auto-scaling's thin I/O, run after each monitoring pass: feed the statistics, poll the queues'
backlogs, report to the Brain (cluster mode) and fetch its plans, then hand everything to the
decision core (`AutoscaleObserved`); afterwards, say what each plan came to. Nothing here
decides: the core's `autoscale_pass` does, with `autoscale.policy`.

Single-job mode has no Brain (`NullBrain`); cluster mode reaches it through `BrainClient`,
which buffers the statistics while the Brain is away, and the job's own policy decides
meanwhile (`BrainPort.mode` says which).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from dlu_api.spec.autoscale_settings import AutoscaleMode, brain_url
from dlu_api.status import JobStage, JobStatus
from dlu_api.vocabulary import EventKind
from dlu_prime.autoscale.feed import JobStatistics, QueueView
from dlu_prime.brain_port import BrainClient, BrainMode, BrainPort, NullBrain
from dlu_prime.brain_port.models import JobPlan, PlanOutcome, RolePlan, registration_from_spec
from dlu_prime.master.change_types import StageChanged
from dlu_prime.master.core.autoscale_pass import Outcome
from dlu_prime.master.core.events import AutoscaleObserved, Event
from dlu_prime.master.metrics import JobMetrics
from dlu_prime.master.ports import StatePort
from dlu_prime.master.state import ChannelRecord, JobState
from dlu_prime.scheduler.base import ActorObservation
from dlu_prime.stats.status import with_statistics

logger = logging.getLogger(__name__)

QUEUE_POLL_S = 5.0  # the queues' backlogs are asked at most this often
REPORT_S = 10.0  # statistics go to the Brain at most this often
# A role's speed is sent once measured over this long at its size (the Brain averages the
# samples it gets: a window of a few whole steps must not weigh as much as a full one).
MIN_WINDOW_S = 5.0
PLAN_POLL_S = 10.0  # the Brain's plan is asked at most this often
METRICS_S = 5.0  # the statistics' metrics are set at most this often (one series per actor)

_RESIZE_ENDS = (EventKind.RESIZE_DONE, EventKind.RESIZE_FAILED)
_MEMORY_ENDS = (EventKind.MEMORY_RELAUNCH_DONE, EventKind.MEMORY_RELAUNCH_FAILED)
_FAILED = (EventKind.RESIZE_FAILED, EventKind.MEMORY_RELAUNCH_FAILED)

QueuePoll = Callable[[Mapping[str, ChannelRecord]], Mapping[str, QueueView]]


def _poll_queues(records: Mapping[str, ChannelRecord]) -> Mapping[str, QueueView]:
    from dlu_prime.autoscale.queues import poll_queues  # Ray: imported where a job has queues

    return poll_queues(records)


@dataclass(frozen=True)
class _Resizing:
    outcome: Outcome
    since: float


class Autoscaler:
    def __init__(
        self,
        port: StatePort,
        handle: Callable[[Event], Any],
        clock: Callable[[], float],
        metrics: Callable[[], JobMetrics | None] = lambda: None,
        poll: QueuePoll = _poll_queues,
        brain: BrainPort | None = None,
    ) -> None:
        self._port = port
        self._handle = handle
        self._metrics = metrics
        self.queue_poll = poll
        self.stats = JobStatistics(clock())
        self._lock = threading.Lock()  # the statistics: fed by the loop, read by `status` callers
        self.brain = brain  # None: made from the spec at the first pass
        self._started = False
        self._finished = False
        self._next_queue_poll = 0.0
        self._next_report = 0.0
        self._next_plan = 0.0
        self._next_metrics = 0.0
        self._plans: dict[str, RolePlan] = {}  # role -> the Brain's newest plan not carried out
        self._seen_plans: set[int] = set()
        self._failed: dict[str, set[int]] = {}  # role -> sizes whose resize failed
        self._resizing: _Resizing | None = None

    @property
    def mode(self) -> BrainMode:
        return self.brain.mode if self.brain is not None else BrainMode.SINGLE_JOB

    def after_pass(self, observations: Mapping[str, ActorObservation], now: float) -> None:
        """Feed the pass's statistics; in an auto-scaled job, let the core decide."""
        state = self._port.state()
        # The loop reads the state outside its lock while Ray's threads change it (a channel's
        # actor registering it, a resize's actors): read under it, then poll a copy (CI: a
        # channel registered during the poll's Ray calls broke its loop, and the job stopped).
        with self._port.lock, self._lock:
            self.stats.observe(state, observations, now)
            channels = dict(state.channels)
        if channels and now >= self._next_queue_poll:
            self._next_queue_poll = now + QUEUE_POLL_S
            views = self.queue_poll(channels)  # Ray calls: outside the locks
            with self._lock:
                self.stats.observe_queues(state, views, now)
        metrics = self._metrics()
        if metrics is not None and now >= self._next_metrics:
            self._next_metrics = now + METRICS_S
            with self._lock:
                speeds, usage, backlogs = (
                    self.stats.meter.summary(),
                    self.stats.usage(),
                    dict(self.stats.backlogs),
                )
            metrics.observe_statistics(speeds, usage, backlogs)
        if not state.spec.autoscale.on or state.stage is not JobStage.RUNNING:
            return
        brain = self._brain(state)
        if now >= self._next_report:
            self._next_report = now + REPORT_S
            with self._lock:
                samples = self.stats.take_samples(now, min_span_s=MIN_WINDOW_S)
            brain.report(samples)
        self._ended(state, brain)
        self._fetch_plans(brain, now)
        with self._port.lock, self._lock:  # the state read where it does not move (see above)
            seen = self.stats.views(state, now)
            quiet = self.stats.quiet_for(now)
            pressed = tuple(self.stats.memory_views(state))
        views = tuple(replace(v, failed=frozenset(self._failed.get(v.role, ()))) for v in seen)
        up = brain.mode is BrainMode.CLUSTER
        plans = tuple(self._plans.values())
        reply = self._handle(AutoscaleObserved(views, quiet, plans, brain_up=up, memory=pressed))
        if isinstance(reply, Outcome):
            self._decided(state, brain, reply, now)

    def on_change(self, state: JobState, change: object) -> None:
        """A state-change hook: the job's end is told to the Brain."""
        if isinstance(change, StageChanged) and change.stage is JobStage.STOPPED:
            self.finish(state)

    def finish(self, state: JobState) -> None:
        """The job ended: the Brain records its outcome (its statistics are flushed first)."""
        if self.brain is None or self._finished:
            return
        self._finished = True
        ok = state.exit_code == 0
        with self._lock:
            samples = self.stats.take_samples(state.updated_at)
        self.brain.report(samples)
        self.brain.job_finished("succeeded" if ok else "failed")
        self.brain.close()

    def status(self, status: JobStatus) -> JobStatus:
        """`status` with the statistics: speed per size, actors' CPU and memory, backlogs."""
        with self._lock:  # `status` is asked on other threads while a pass feeds the statistics
            shown = with_statistics(status, self.stats.meter, self.stats.usage(), self.stats.backlogs)
        mode = self._port.state().spec.autoscale.mode
        if mode is AutoscaleMode.OFF:
            return shown
        return shown.model_copy(update={"autoscale": self._mode_text(mode)})

    def _mode_text(self, mode: AutoscaleMode) -> str:
        brain = self.brain
        if mode is AutoscaleMode.SINGLE_JOB or brain is None:
            return str(mode.value)
        if brain.mode is BrainMode.CLUSTER:
            return "cluster: executing the Brain's plans"
        buffered = brain.buffered if isinstance(brain, BrainClient) else 0
        return f"cluster: the Brain is away, the job decides alone ({buffered} samples buffered)"

    # the Brain ---------------------------------------------------------------------------------
    def _brain(self, state: JobState) -> BrainPort:
        if self.brain is None:
            self.brain = NullBrain()
            if state.spec.autoscale.mode is AutoscaleMode.CLUSTER:
                try:
                    url = brain_url(state.spec.autoscale)
                    assert url is not None
                    self.brain = BrainClient(url)
                except ValueError as exc:  # preflight refuses this; a spec made by hand may not
                    logger.error("job %s: %s; single-job mode", state.job, exc)
        if not self._started:
            self._started = True
            first = self.brain.job_started(registration_from_spec(state.spec, state.run_id))
            self._take(first)
        return self.brain

    def _fetch_plans(self, brain: BrainPort, now: float) -> None:
        if isinstance(brain, NullBrain) or now < self._next_plan:
            return
        self._next_plan = now + PLAN_POLL_S
        self._take(brain.plan())

    def _take(self, plan: JobPlan | None) -> None:
        """The plan's new role plans; a newer plan for a role replaces one not carried out yet."""
        for role in plan.roles if plan is not None else ():
            if role.id is None or role.id in self._seen_plans or role.state != "proposed":
                continue
            self._seen_plans.add(role.id)
            self._plans[role.role] = role

    def _outcome(self, brain: BrainPort, state: JobState, plan_id: int | None, error: str) -> None:
        if plan_id is None:
            return
        verdict = "unplaceable" if error else "applied"
        brain.plan_outcome(PlanOutcome(run_id=state.run_id, plan_id=plan_id, state=verdict, reason=error))

    # what a decision came to -------------------------------------------------------------------
    def _decided(self, state: JobState, brain: BrainPort, outcome: Outcome, now: float) -> None:
        if outcome.plan_id is not None:
            self._plans.pop(outcome.role, None)
        if outcome.began:
            self._resizing = _Resizing(outcome, now)
            return
        if outcome.error and outcome.plan_id is None and not outcome.memory:
            self._failed.setdefault(outcome.role, set()).add(outcome.new)
        self._outcome(brain, state, outcome.plan_id, outcome.error)

    def _ended(self, state: JobState, brain: BrainPort) -> None:
        """The resize a decision began is over: a failed one is not proposed again (and a
        Brain's plan is reported unplaceable); a done one is reported applied."""
        resizing = self._resizing
        if resizing is None or state.resize is not None or state.relaunch is not None:
            return
        self._resizing = None
        outcome = resizing.outcome
        kinds = _MEMORY_ENDS if outcome.memory else _RESIZE_ENDS
        ended = [
            e for e in state.events if e.role == outcome.role and e.time >= resizing.since and e.kind in kinds
        ]
        failed = bool(ended) and ended[-1].kind in _FAILED
        if failed and not outcome.memory:
            self._failed.setdefault(outcome.role, set()).add(outcome.new)
        self._outcome(brain, state, outcome.plan_id, ended[-1].message if failed else "")
