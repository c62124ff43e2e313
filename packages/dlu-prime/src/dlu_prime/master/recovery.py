"""Running the recoveries the failover policy decides: the tiers of the ladder, node relaunch,
the restarts SubMasters ask for, and the in-place restarts ranks report.

Every count and every in-flight record goes through the manager's one apply, saved before the
scheduler acts, so a PrimeMaster that dies half way finishes the recovery without counting it
twice (`resume`).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from dlu_api.status import JobStage
from dlu_api.vocabulary import (
    DEATH_KINDS,
    ActorStage,
    EventKind,
    FailureKind,
    InPlaceDecision,
    InPlaceVerdict,
    Tier,
)
from dlu_prime.extension import NodeInfo
from dlu_prime.master.changes import (
    ActorsPlaced,
    ActorsRestarting,
    FailoverBegan,
    FailoverEnded,
    FailuresCounted,
    InPlaceJudged,
    MasterRestarted,
    NodesRelaunched,
    NodesRemoved,
    Note,
)
from dlu_prime.master.failover import (
    FailoverPlan,
    Recovery,
    job_restart,
    judge_inplace,
    plan_failover,
    role_limit_reached,
)
from dlu_prime.master.lifecycle import (
    EXIT_FAILED,
    FencedError,
    IllegalTransition,
    RestartLimitError,
    gone,
    unstarted,
)
from dlu_prime.master.monitor import Failure
from dlu_prime.master.resize import resizing
from dlu_prime.master.state import SUB_MASTER_RANK, FailoverRecord
from dlu_prime.master.tiers import Budget, escalation, over_limit
from dlu_prime.scheduler.base import ActorObservation

if TYPE_CHECKING:
    from dlu_prime.master.manager import PrimeManager

logger = logging.getLogger(__name__)

# A role failover through its SubMaster replaces and sets up actors: minutes on a big node, never
# forever. Past this the failover failed (and escalates to a job restart).
SUB_MASTER_FAILOVER_TIMEOUT_S = 600.0


class FailoverRunner:
    def __init__(
        self, manager: PrimeManager, sub_master_timeout_s: float = SUB_MASTER_FAILOVER_TIMEOUT_S
    ) -> None:
        self._manager = manager
        self.sub_master_timeout_s = sub_master_timeout_s

    # deciding --------------------------------------------------------------------------------
    def recover(
        self, failures: Sequence[Failure], observations: Mapping[str, ActorObservation] | None = None
    ) -> FailoverPlan:
        """deal_with_actor_restarting, then failover handling, as the pure policy decides.
        `observations` (this pass's poll) tell which other actors went with a dead one's node."""
        m = self._manager
        state = m.state
        seen = observations or {}
        lost = {name for name, o in seen.items() if gone(o) or o.unavailable}
        nodes = {
            state.actors[f.actor].node_id or f.node_id
            for f in failures
            if f.kind in DEATH_KINDS and f.actor in state.actors
        }
        dead_nodes = (
            m.scheduler.dead_nodes([n for n in nodes if n is not None]) if nodes - {None} else set[str]()
        )
        plan = plan_failover(
            state, failures, has_extension=m.extension is not None, gone=lost, dead_nodes=dead_nodes
        )
        if plan.ignored and not plan.acts:
            during = "a recovery" if state.failover else state.stage.value
            logger.info("job %s: ignored %d report(s) during %s", state.job, len(plan.ignored), during)
        m.apply(FailuresCounted(plan.node_failures, plan.notes))
        if plan.relaunch_nodes and not self._relaunch(plan.relaunch_nodes):
            return plan
        if plan.stop is not None:
            m.finish(EXIT_FAILED, plan.stop)
            return plan
        for recovery in plan.recoveries:
            if m.state.stage is not JobStage.RUNNING:
                break
            self.start(recovery)
        return plan

    # acting ----------------------------------------------------------------------------------
    def _relaunch(self, nodes: tuple[str, ...]) -> bool:
        """Tier 4: mark the nodes removed (saved first), then let the Extension replace them."""
        m = self._manager
        assert m.extension is not None
        with m.lock:
            infos = [
                NodeInfo(node, actors=tuple(n for n, a in m.state.actors.items() if a.node_id == node))
                for node in nodes
            ]
            m.apply(NodesRemoved(nodes))
        started = m.clock()
        try:
            replaced = m.extension.relaunch_nodes_impl(infos)
        except Exception as exc:  # ExtensionError, or any bug in the extension: stop safely
            names = ", ".join(n[:12] for n in nodes)
            m.finish(EXIT_FAILED, f"node relaunch of {names} failed: {type(exc).__name__}: {exc}")
            return False
        m.apply(NodesRelaunched(nodes, [n.node_id for n in replaced], m.clock() - started))
        return True

    def self_recover(self) -> None:
        """Tier 6, on a reconstructed PrimeMaster's loaded state: counted, then RUNNING carries on
        (actors saved READY but never started are started; an in-flight failover or resize is
        finished by the loop), past `master_max_restart` or in a short-lived stage it stops."""
        m = self._manager
        state = m.state
        over = over_limit(state, Budget.MASTER)  # this restart, counted next, would pass the limit
        m.apply(MasterRestarted())
        limit = state.spec.limits.master_max_restart
        try:
            if over and state.stage is not JobStage.STOPPED:
                restarts = f"{state.master_restart_count} PrimeMaster restarts"
                m.finish(EXIT_FAILED, f"master_max_restart={limit} reached ({restarts})")
            elif state.stage is JobStage.RUNNING:
                m.resizer.adopt()
                waiting = unstarted(state)
                if waiting:
                    m.scheduler.start(waiting)
            elif state.stage is not JobStage.STOPPED:
                stage = state.stage.value
                m.finish(
                    EXIT_FAILED, f"PrimeMaster restarted during {stage}, a short-lived stage; stopped safely"
                )
        except (FencedError, IllegalTransition):
            raise
        except Exception as exc:
            logger.exception("job %s: self-recovery failed", state.job)
            m.finish(EXIT_FAILED, f"PrimeMaster self-recovery failed: {type(exc).__name__}: {exc}")

    def start(self, recovery: Recovery, escalated: bool = False) -> None:
        """Count and save the recovery in flight, then run it to its end."""
        self._manager.apply(FailoverBegan(recovery, escalated))
        self.resume()

    def resume(self) -> None:
        """Run the saved in-flight recovery to its end (also after a PrimeMaster restart). A role
        or SubMaster recovery that fails escalates to a job-level restart (`failover_escalated`:
        the same fault's recovery going on, not another fault); a failed job restart stops the
        job. The in-flight record is cleared on every path."""
        m = self._manager
        record = m.state.failover
        if record is None:
            return
        error: str | None = None
        try:
            if record.tier is Tier.JOB:
                self._restart_job(record)
            elif record.tier is Tier.SUB_MASTER:
                self._restart_sub_master(record)
            else:
                self._restart_role(record)
        except FencedError:
            raise
        except Exception as exc:
            error = f"{type(exc).__name__}: {exc}"
            logger.exception("job %s: %s failover failed", m.state.job, record.tier.value)
        m.apply(FailoverEnded(record, error))
        if error is None or m.state.stage in (JobStage.STOPPING, JobStage.STOPPED):
            return
        if escalation(record.tier) is None or m.state.stage is not JobStage.RUNNING:
            m.finish(EXIT_FAILED, f"job-level failover failed: {error}; first failure: {record.reason}")
            return
        first = Failure(
            record.culprit or record.actors[0], record.role or "", FailureKind.FAILOVER_FAILED, error
        )
        recoveries, stop = job_restart(m.state, first, [record.role] if record.role else [])
        if stop is not None:
            m.finish(EXIT_FAILED, stop)
            return
        self.start(recoveries[0], escalated=True)

    def _restart_role(self, record: FailoverRecord) -> None:
        """Tier 2: through the role's SubMaster when it has one (it calls `restart_actors` back
        and restarts training, within `sub_master_timeout_s`), else the PrimeMaster replaces and
        starts the actors itself."""
        m = self._manager
        assert record.role is not None
        sub = [n for n, a in m.state.actors.items() if a.role == record.role and a.rank == SUB_MASTER_RANK]
        if sub:
            m.scheduler.call(
                sub[0], "failover", list(record.actors), record.reason, timeout_s=self.sub_master_timeout_s
            )
        else:
            self.replace(list(record.actors))
            m.scheduler.start(list(record.actors))

    def _restart_sub_master(self, record: FailoverRecord) -> None:
        """Tier 5: SubMasters keep no state: set the role up again and recover it to RUNNING."""
        self.replace(list(record.actors))
        for name in record.actors:
            self._manager.scheduler.call(name, "recover_running")

    def _restart_job(self, record: FailoverRecord) -> None:
        """Tier 3: roll back to INIT, restart every actor, check, and run again."""
        m = self._manager
        if m.state.stage is JobStage.RUNNING:
            m.transition(JobStage.INIT, f"job-level restart: {record.reason}")
        m.liveness.forget()
        self.replace(list(record.actors))
        m.checks.run([])
        m.transition(JobStage.READY, "every actor restarted and passed its self check")
        m.start()

    def replace(self, names: list[str], note: Note | None = None) -> None:
        """The one way actors are replaced: fresh ones, set up, recorded READY on their nodes."""
        nodes = self._manager.scheduler.restart(names)
        self._manager.apply(ActorsPlaced(nodes, ActorStage.READY, fresh=True, note=note))

    # asked by SubMasters and ranks -----------------------------------------------------------
    def restart_actors(self, names: list[str], reason: str) -> None:
        """Replace actors of one or more roles (asked by a SubMaster): counted, limited and saved
        before the scheduler acts. A failover that asks for it (through a SubMaster) was already
        counted and checked against the limit.

        Raises:
            KeyError: an unknown actor.
            RestartLimitError: a role would exceed its max_restart; nothing was restarted.
        """
        m = self._manager
        with m.lock:
            unknown = [n for n in names if n not in m.state.actors]
            if unknown:
                raise KeyError(f"no such actor(s): {', '.join(unknown)}")
            in_flight = m.state.failover
            counted = not (in_flight is not None and set(names) <= set(in_flight.actors))
            for role in sorted({m.state.actors[n].role for n in names}) if counted else []:
                over = role_limit_reached(m.state, role)
                if over is not None:
                    raise RestartLimitError(f"{over} (restarting {', '.join(names)}: {reason})")
            m.apply(ActorsRestarting(names, reason, counted))
        self.replace(names, Note(EventKind.ACTORS_RESTARTED, f"{len(names)} actor(s) replaced and ready"))

    def note_inplace_restart(
        self, role: str, message: str, agent: str | None = None, error: str = "", recovered: bool = False
    ) -> InPlaceDecision:
        """A SubMaster's rank `agent` failed its training process: a fault of its own (tier 1,
        counted here so the count survives the SubMaster), the effect of a peer's fault being
        handled (joined, not counted), or one over the role's limit (the job stops).
        `recovered`: found after its round moved on (a failover or resize re-forms training
        anyway): counted if it is its own fault, with no restart of its own."""
        m = self._manager
        leaving = resizing(m.state)  # a resize in flight already handles them: no slow poll
        peers = [
            n
            for n, a in m.state.actors.items()
            if a.role == role and a.rank != SUB_MASTER_RANK and n != agent and n not in leaving
        ]
        # Peers on a node Ray marks dead are dead: asking them would wait out the poll timeout
        # (Ray cannot place them again) while the rank's agent waits for this answer.
        nodes = [node for n in peers if (node := m.state.actors[n].node_id) is not None]
        down = m.scheduler.dead_nodes(nodes) if nodes else set[str]()
        dead = [n for n in peers if m.state.actors[n].node_id in down]
        alive = [n for n in peers if n not in dead]
        dead += [n for n, seen in m.scheduler.poll(alive).items() if gone(seen)] if alive else []
        with m.lock:
            decision = judge_inplace(m.state, role, agent, message, dead, error, recovered)
            m.apply(InPlaceJudged(role, agent, message, decision))
        if decision.verdict is InPlaceVerdict.STOP:
            m.request_stop_failed(decision.reason)
        elif dead:
            m.wake()  # the dead peer's failover starts at once
        return decision
