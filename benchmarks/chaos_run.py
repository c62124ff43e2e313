"""Running the chaos campaign: submit a job, inject its planned faults one by one (each once the
job is back at work after the previous one), follow it to its end, and return what was
injected, the whole timeline, the final status and what was left behind.

Ray must be initialized in this process. Node removal needs the `ray.cluster_utils.Cluster`
the job runs on.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import chaos_faults as faults
from chaos_check import Injected, LimitCheck
from chaos_jobs import ROLE, WORKDIR, WORKER_NODE_ARGS, Pipeline, Training
from chaos_schedule import FaultKind, Planned
from chaos_watch import Back, Before, JobWatch, Ranks, back_to_training, back_to_work, leaks, wait_for

from dlu_api.status import JobEvent, JobStatus

logger = logging.getLogger(__name__)

RECOVERY_TIMEOUT_S = 180.0  # one fault -> back at work, generous for a loaded 2-core machine
START_TIMEOUT_S = 300.0


ENDING_MARGIN = 50  # steps between the furthest rank and the step an open-ended run ends at


@dataclass
class Outcome:
    """What one job of the campaign gave."""

    job: str
    injected: list[Injected] = field(default_factory=list[Injected])
    events: list[JobEvent] = field(default_factory=list[JobEvent])
    final: JobStatus | None = None
    leaks: list[str] = field(default_factory=list[str])
    notes: list[str] = field(default_factory=list[str])
    last_step: int | None = None  # an open-ended run: the step the campaign ended it at


def run_reference(training: Training) -> str | None:
    """The fault-free run of the same training (its step padding changes no loss): the final
    loss every campaign run must end with."""
    from dlu_prime import launcher

    status = launcher.run_job(training.spec(), WORKDIR)
    if status.exit_code != 0:
        raise RuntimeError(f"the fault-free reference run failed: {status.reason}")
    return training.final_loss()


class TrainingCampaign:
    """The planned faults on one run of the reference elastic job."""

    def __init__(
        self, training: Training, cluster: Any = None, recovery_timeout_s: float = RECOVERY_TIMEOUT_S
    ) -> None:
        self.training = training
        self.cluster = cluster
        self.recovery_timeout_s = recovery_timeout_s
        self.job = training.name
        self.watch = JobWatch(self.job, ROLE)
        self.ranks = _ranks(training)
        self.outcome = Outcome(self.job)

    def actor(self, rank: int) -> str:
        from dlu_prime.naming import actor_name

        return actor_name(self.job, ROLE, rank)

    def run(self, plan: Sequence[Planned], finish_timeout_s: float) -> Outcome:
        from dlu_prime import launcher

        spec = self.training.spec()
        launcher.submit_job(spec, WORKDIR)
        timed = sorted(
            (p for p in plan if p.kind is not FaultKind.ELASTIC_MASTER_NODE_CHECK), key=lambda p: p.at
        )
        if any(p.kind is FaultKind.ELASTIC_MASTER_NODE_CHECK for p in plan):
            self._node_check_kill()
        else:
            self._settle([], NOTHING, restarted=False, timeout_s=START_TIMEOUT_S, need_event=False)
        origin = time.monotonic()
        for planned in timed:
            due = origin + planned.at
            while time.monotonic() < due:
                self.watch.collect()
                time.sleep(0.2)
            current = self.watch.status()
            if current is None or current.finished:
                self.outcome.notes.append(f"job ended before the fault planned at +{planned.at:.0f} s")
                break
            logger.info("chaos: %s (target %s) at +%.1f s", planned.kind.value, planned.target, planned.at)
            self._inject(planned)
        if self.training.open_ended:
            self._end_training()
        final = self.watch.wait_stopped(finish_timeout_s)
        if final is None:
            self.outcome.notes.append(f"job did not stop within {finish_timeout_s:.0f} s; stopped it")
            launcher.stop_job(self.job)
            final = self.watch.wait_stopped(120.0)
        self.outcome.final = final
        self.outcome.leaks = leaks(self.job, self.training.pid_dir, include_master=False)
        launcher.wait_job(spec)
        self.outcome.leaks += leaks(self.job, None, include_master=True)
        self.outcome.events = list(self.watch.events)
        return self.outcome

    def _end_training(self) -> None:
        """Every fault is in and recovered: training ends ENDING_MARGIN steps past the furthest
        rank (ranks are within a step of each other: they meet in a collective every step)."""
        current = self.watch.status()
        reached = max(self.watch.steps(current).values(), default=0) if current is not None else 0
        last = min(self.training.steps, reached + ENDING_MARGIN)
        tmp = self.training.stop_file.with_suffix(".tmp")
        tmp.write_text(f"{last}\n")
        tmp.replace(self.training.stop_file)
        self.outcome.last_step = last
        logger.info("chaos: training ends at step %d (ranks at %d)", last, reached)

    # waiting -----------------------------------------------------------------------------------
    def _before(self) -> Before:
        current = self.watch.status()
        return Before(self.watch.steps(current) if current is not None else {}, self.ranks.pids())

    def _settle(
        self,
        injected: list[Injected],
        before: Before,
        *,
        restarted: bool,
        timeout_s: float | None = None,
        need_event: bool = True,
    ) -> Back:
        """Wait until training is back; stamp the faults just injected with it. `restarted`:
        the fault must have replaced every rank's training process."""
        timeout_s = timeout_s or self.recovery_timeout_s
        at = injected[0].at if injected else time.time()
        back = back_to_training(
            self.watch, self.ranks, at, before, timeout_s, restarted=restarted, need_event=need_event
        )
        what = ", ".join(f"{f.kind} on {f.culprit()}" for f in injected) or "the start"
        if back.at is None:
            seen = "; ".join(
                f"{e.kind} {e.actor or ''}: {e.message[:120]}" for e in self.watch.events if e.time >= at
            )
            why = "job stopped" if back.stopped else f"not back to training within {timeout_s:.0f} s"
            self.outcome.notes.append(f"{why} after {what}; timeline since: {seen or 'nothing'}")
            logger.warning("chaos: %s", self.outcome.notes[-1])
        else:
            logger.info("chaos: back to training %.1f s after %s", back.at - at, what)
        for index, fault in enumerate(injected):
            lost = back.lost_steps if index == len(injected) - 1 else 0
            self.outcome.injected.append(
                _stamped(fault, back.at if fault.settled_at is None else fault.settled_at, lost)
            )
        return back

    # faults ------------------------------------------------------------------------------------
    def _inject(self, planned: Planned) -> None:
        kind = planned.kind
        before = self._before()
        restarts = kind not in (FaultKind.PRIME_MASTER_KILL, FaultKind.PRIME_MASTER_TWICE)
        if kind in (FaultKind.PROC_CRASH, FaultKind.PROC_HANG):
            actor = self.actor(planned.target or 0)
            proc = faults.training_process(actor)
            fault = Injected(kind.value, self.job, time.time(), actor=actor, planned=kind.value)
            (faults.crash_process if kind is FaultKind.PROC_CRASH else faults.hang_process)(proc)
            self._settle([fault], before, restarted=restarts)
        elif kind is FaultKind.WORKER_KILL:
            self._settle(
                [self._kill_actor(self.actor(planned.target or 0), kind)], before, restarted=restarts
            )
        elif kind is FaultKind.ELASTIC_MASTER_KILL:
            self._settle([self._kill_actor(self._sub_master(), kind)], before, restarted=restarts)
        elif kind is FaultKind.PRIME_MASTER_KILL:
            self._settle([self._kill_master(kind)], before, restarted=restarts)
        elif kind is FaultKind.PRIME_MASTER_TWICE:
            first = self._kill_master(kind)
            back_at = self._master_back(first.at)
            second = self._kill_master(kind)
            self._settle([_stamped(first, back_at, 0), second], before, restarted=restarts)
        elif kind is FaultKind.PRIME_MASTER_IN_FAILOVER:
            worker = self._kill_actor(self.actor(planned.target or 0), kind, as_kind=FaultKind.WORKER_KILL)
            self._wait_failover_started(worker.at)
            self._settle([worker, self._kill_master(kind)], before, restarted=restarts)
        elif kind is FaultKind.NODE_REMOVAL:
            self._settle([self._remove_node(planned.target or 0)], before, restarted=restarts)
        else:
            raise ValueError(f"{kind.value} is not a fault of the training job")

    def _sub_master(self) -> str:
        from dlu_prime.naming import sub_master_name

        return sub_master_name(self.job, ROLE)

    def _kill_actor(self, actor: str, planned: FaultKind, as_kind: FaultKind | None = None) -> Injected:
        pid = faults.actor_pid(actor)
        fault = Injected(
            (as_kind or planned).value, self.job, time.time(), actor=actor, planned=planned.value
        )
        faults.kill_pid(pid)
        return fault

    def _kill_master(self, planned: FaultKind) -> Injected:
        from dlu_prime.naming import master_name

        pid = faults.master_pid(self.job)
        fault = Injected(
            FaultKind.PRIME_MASTER_KILL.value,
            self.job,
            time.time(),
            actor=master_name(self.job),
            planned=planned.value,
        )
        faults.kill_pid(pid)
        return fault

    def _master_back(self, since: float) -> float:
        """Time the restarted PrimeMaster first answered with its restart recorded."""
        wait_for(
            "the PrimeMaster to be back",
            lambda: (
                self.watch.status(events=20) is not None
                and bool(self.watch.recoveries_since(since, frozenset({"master_restarted"})))
            ),
            RECOVERY_TIMEOUT_S,
            every=0.05,
        )
        return time.time()

    def _wait_failover_started(self, since: float) -> None:
        """Until the role failover of a killed worker is on the timeline (in flight: the actor
        setup delay holds it there for a while)."""

        def started() -> bool:
            self.watch.status(events=20)
            return bool(self.watch.recoveries_since(since, frozenset({"failover_started"})))

        try:
            wait_for("the role failover to start", started, RECOVERY_TIMEOUT_S, every=0.02)
        except TimeoutError as exc:
            self.outcome.notes.append(f"PrimeMaster killed without a failover in flight: {exc}")

    def _remove_node(self, index: int) -> Injected:
        if self.cluster is None:
            raise ValueError(
                "node_removal needs the job on a ray.cluster_utils.Cluster (run benchmarks/chaos.py)"
            )
        node = faults.actor_node(self.actor(index * self.training.nproc))
        current = self.watch.status()
        if node is None or current is None:
            raise RuntimeError(f"cannot tell which Ray node runs node {index} of {self.job}")
        on_node = tuple(a.name for r in current.roles for a in r.actors if a.node_id == node)
        fault = Injected(
            FaultKind.NODE_REMOVAL.value,
            self.job,
            time.time(),
            node=node,
            node_actors=on_node,
            planned="node_removal",
        )
        faults.remove_node(self.cluster, node, replace=True, node_args=WORKER_NODE_ARGS)
        return fault

    def _node_check_kill(self) -> None:
        """Kill the ElasticMaster once the node check's first probe has started."""
        counter = self.training.node_check_counter
        wait_for(
            "the node check to start",
            lambda: counter.exists() and bool(counter.read_text().strip()),
            START_TIMEOUT_S,
            every=0.02,
        )
        fault = self._kill_actor(self._sub_master(), FaultKind.ELASTIC_MASTER_NODE_CHECK)
        self._settle([fault], NOTHING, restarted=False, timeout_s=START_TIMEOUT_S)


NOTHING = Before({}, {})


def _ranks(training: Training) -> Ranks:
    from dlu_prime.naming import actor_name

    actors = tuple(actor_name(training.name, ROLE, rank) for rank in range(training.ranks))
    return Ranks(actors, training.pid_dir, training.checkpoint_every)


def _stamped(fault: Injected, settled_at: float | None, lost_steps: int) -> Injected:
    from dataclasses import replace

    return replace(fault, settled_at=settled_at, lost_steps=lost_steps)


def run_pipeline(pipeline: Pipeline, plan: Sequence[Planned], finish_timeout_s: float) -> Outcome:
    """The pipeline job with its planned producer and consumer kills."""
    from dlu_prime import launcher
    from dlu_prime.naming import actor_name

    spec = pipeline.spec()
    watch = JobWatch(pipeline.name)
    outcome = Outcome(pipeline.name)
    launcher.submit_job(spec, WORKDIR)
    producer = actor_name(pipeline.name, "source", 0)

    def producing() -> bool:
        current = watch.status()
        return current is not None and (watch.steps(current).get(producer) or 0) > 0

    wait_for("the pipeline to run", producing, START_TIMEOUT_S)
    origin = time.monotonic()
    for planned in sorted(plan, key=lambda p: p.at):
        while time.monotonic() < origin + planned.at:
            watch.collect()
            time.sleep(0.2)
        current = watch.status()
        if current is None or current.finished:
            outcome.notes.append(f"pipeline ended before the fault planned at +{planned.at:.0f} s")
            break
        if planned.kind is FaultKind.PRODUCER_KILL:
            actor = producer
        elif planned.kind is FaultKind.CONSUMER_KILL:
            actor = actor_name(pipeline.name, "sink", planned.target or 0)
        else:
            raise ValueError(f"{planned.kind.value} is not a fault of the pipeline job")
        logger.info("chaos: %s of %s at +%.1f s", planned.kind.value, actor, planned.at)
        pid = faults.actor_pid(actor)
        fault = Injected(
            planned.kind.value, pipeline.name, time.time(), actor=actor, planned=planned.kind.value
        )
        faults.kill_pid(pid)
        back = back_to_work(watch, fault.at, actor, RECOVERY_TIMEOUT_S)
        if back.at is None:
            outcome.notes.append(
                f"{actor} not back at work within {RECOVERY_TIMEOUT_S:.0f} s after {planned.kind.value}"
            )
        outcome.injected.append(_stamped(fault, back.at, 0))
    final = watch.wait_stopped(finish_timeout_s)
    if final is None:
        outcome.notes.append(f"pipeline did not stop within {finish_timeout_s:.0f} s; stopped it")
        launcher.stop_job(pipeline.name)
        final = watch.wait_stopped(120.0)
    outcome.final = final
    outcome.leaks = leaks(pipeline.name, None, include_master=False)
    launcher.wait_job(spec)
    outcome.leaks += leaks(pipeline.name, None, include_master=True)
    outcome.events = list(watch.events)
    return outcome


def run_limit_case(training: Training, kills: int = 3) -> tuple[LimitCheck, list[str]]:
    """Kill one ElasticWorker `kills` times on a role with max_restart = kills - 1: the job must
    stop failed, its reason naming the limit and that actor. Returns the check and any leaks."""
    from dlu_prime import launcher
    from dlu_prime.naming import actor_name

    spec = training.spec()
    victim = actor_name(training.name, ROLE, training.ranks - 1)
    watch = JobWatch(training.name, ROLE)
    launcher.submit_job(spec, WORKDIR)
    ranks = _ranks(training)
    back_to_training(watch, ranks, time.time(), NOTHING, START_TIMEOUT_S, restarted=False, need_event=False)
    for kill in range(kills):
        current = watch.status()
        if current is None or current.finished:
            break
        before = Before(watch.steps(current), ranks.pids())
        at = time.time()
        faults.kill_pid(faults.actor_pid(victim))
        if kill < kills - 1:
            back_to_training(watch, ranks, at, before, RECOVERY_TIMEOUT_S, restarted=True)
    final = watch.wait_stopped(RECOVERY_TIMEOUT_S)
    if final is None:
        launcher.stop_job(training.name)
        final = watch.wait_stopped(120.0)
    found = leaks(training.name, training.pid_dir, include_master=False)
    launcher.wait_job(spec)
    found += leaks(training.name, None, include_master=True)
    check = LimitCheck(
        limit=f"max_restart={training.max_restart}",
        culprit=victim,
        exit_code=final.exit_code if final is not None else None,
        reason=final.reason if final is not None else "the job did not stop",
    )
    return check, found
