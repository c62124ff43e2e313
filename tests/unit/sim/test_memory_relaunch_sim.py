"""A memory relaunch wired into the PrimeManager, on the simulated cluster and clock: an actor
that stays at 90% of its role's `resources.memory` is replaced with 1.5 times as much (through
its SubMaster where its role has one), not counted as a fault, at most once per settle period,
never past what its node holds, never during a failover; a Brain's memory plan is carried out
on the role's actor under pressure and reported back."""

from __future__ import annotations

import pytest

from dlu_api.cli.render import status_text
from dlu_api.vocabulary import EventKind, Tier
from dlu_prime.autoscale.memory import MemoryView
from dlu_prime.brain_port import BrainMode, BrainPort
from dlu_prime.brain_port.models import JobPlan, JobRegistration, PlanOutcome, RolePlan, StatSample
from dlu_prime.master.core import autoscale_pass
from dlu_prime.master.core.events import AutoscaleObserved
from dlu_prime.master.relaunch import RelaunchBegan
from dlu_prime.master.state import FailoverRecord
from dlu_prime.testing.sim.autoscale_run import ELASTIC, WORKERS, AutoscaleSim, backlog_spec, elastic_spec
from dlu_prime.testing.sim.workloads import BurstyQueue, ElasticSteps

pytestmark = pytest.mark.timeout(120)

GiB = 2**30


def _events(sim: AutoscaleSim, kind: EventKind) -> list[tuple[float, str]]:
    return [(e.time - sim.started, e.message) for e in sim.manager.state.events if e.kind == kind]


def _faults_counted(sim: AutoscaleSim) -> tuple[int, ...]:
    state = sim.manager.state
    roles = [(r.restart_count, r.inplace_restart_count, r.escalation_count) for r in state.roles.values()]
    return (
        state.job_restart_count,
        state.global_restart_count,
        *(n for counts in roles for n in counts),
        *(a.restart_count + a.total_failures for a in state.actors.values()),
    )


def workers_sim() -> AutoscaleSim:
    spec = backlog_spec(3, 8, memory="1GiB")  # settle 5 s, measure 10 s
    queue = BurstyQueue("samples", WORKERS, 5.0, lambda t: 15.0)  # three actors keep up
    return AutoscaleSim(spec).with_queue(queue)


def test_an_actor_at_90_percent_for_a_while_is_relaunched_with_half_as_much_again() -> None:
    sim = workers_sim()
    actor = "backlog.prep.1"
    sim.cluster.node_memory = 16 * GiB
    sim.run(2)
    sim.cluster.use_memory(actor, int(0.95 * GiB))
    pressed_at = sim.clock() - sim.started
    sim.run(60, until=lambda s: bool(_events(s, EventKind.MEMORY_RELAUNCH_DONE)))
    ((when, message),) = _events(sim, EventKind.MEMORY_RELAUNCH)
    assert message == "prep.1 at 973 MiB of 1 GiB (95%): relaunched with 1.5 GiB"
    assert when - pressed_at >= 10  # sustained for measure_s, over more than one sample
    assert sim.cluster.replaced == [(actor, int(1.5 * GiB))]  # the replacement asked for the new memory
    record = sim.manager.state.actors[actor]
    assert record.memory == int(1.5 * GiB) and sim.manager.state.relaunch is None
    assert set(_faults_counted(sim)) == {0} and sim.manager.state.first_failure is None
    made = [str(e.kind) for e in sim.manager.state.events]
    assert not [k for k in made if k.startswith("failover")]
    sim.run(3)
    status = sim.manager.status()
    shown = next(a for r in status.roles for a in r.actors if a.name == actor)
    assert shown.memory_limit_bytes == int(1.5 * GiB) and shown.restart_count == 0
    assert "relaunched with 1536 MiB" in status_text(status)


def test_once_per_settle_period_and_never_past_what_the_node_holds() -> None:
    sim = workers_sim()
    actor = "backlog.prep.0"
    sim.cluster.node_memory = 2 * GiB
    sim.run(2)
    sim.cluster.use_memory(actor, int(0.99 * GiB))
    sim.run(60, until=lambda s: bool(_events(s, EventKind.MEMORY_RELAUNCH_DONE)))
    first = _events(sim, EventKind.MEMORY_RELAUNCH)[0][0]
    sim.cluster.use_memory(actor, int(1.49 * GiB))  # the new incarnation fills its 1.5 GiB too
    sim.run(60, until=lambda s: len(_events(s, EventKind.MEMORY_RELAUNCH_DONE)) == 2)
    (_, _), (second, message) = _events(sim, EventKind.MEMORY_RELAUNCH)
    assert second - first >= 10  # settle 5 s, and measure 10 s of the new incarnation
    assert message.endswith("relaunched with 2 GiB (its node holds 2 GiB)")  # not 2.25 GiB
    assert [m for _, m in sim.cluster.replaced] == [int(1.5 * GiB), 2 * GiB]
    sim.cluster.use_memory(actor, int(1.99 * GiB))
    sim.run(60)
    assert len(_events(sim, EventKind.MEMORY_RELAUNCH)) == 2  # the node holds no more
    assert set(_faults_counted(sim)) == {0}


def test_a_single_high_sample_is_not_a_need() -> None:
    sim = workers_sim()
    sim.run(2)
    sim.cluster.use_memory("backlog.prep.2", int(0.95 * GiB))
    sim.run(5)  # one usage sample at pressure
    sim.cluster.use_memory("backlog.prep.2", int(0.5 * GiB))
    sim.run(40)
    assert _events(sim, EventKind.MEMORY_RELAUNCH) == [] and sim.cluster.replaced == []


def test_no_limit_no_relaunch() -> None:
    spec = backlog_spec(3, 8)  # no resources.memory: Ray gives it no limit to outgrow
    sim = AutoscaleSim(spec).with_queue(BurstyQueue("samples", WORKERS, 5.0, lambda t: 15.0))
    sim.run(2)
    sim.cluster.use_memory("backlog.prep.1", 64 * GiB)
    sim.run(40)
    assert _events(sim, EventKind.MEMORY_RELAUNCH) == [] and sim.cluster.replaced == []


def test_an_elastic_rank_is_relaunched_through_its_sub_master_and_not_counted() -> None:
    spec = elastic_spec(1, 8, memory="2GiB")  # settle 5 s, measure 20 s
    sim = AutoscaleSim(spec).with_steps(ElasticSteps(ELASTIC, 1.0, 0.04))
    rank = "autoscale.train.3"
    told: list[tuple[str, list[str]]] = []
    sim.cluster.hook = lambda what, names: told.append((what, list(names)))
    sim.run(2)
    sim.cluster.use_memory(rank, int(1.9 * GiB))
    sim.run(80, until=lambda s: bool(_events(s, EventKind.MEMORY_RELAUNCH_DONE)))
    (_, message), *_ = _events(sim, EventKind.MEMORY_RELAUNCH)
    assert message == "train.3 at 1.9 GiB of 2 GiB (95%): relaunched with 3 GiB"
    assert (rank, 3 * GiB) in sim.cluster.replaced
    assert [n for what, n in told if what == "failover"] == [[rank]]  # the role tier's, via the SubMaster
    assert set(_faults_counted(sim)) == {0}
    restarting = [m for _, m in _events(sim, EventKind.ACTORS_RESTARTING)]
    assert restarting and all(rank in m for m in restarting)


def test_never_during_a_failover_or_a_resize_or_another_relaunch() -> None:
    sim = workers_sim()
    sim.run(3)
    state = sim.manager.state
    now = sim.clock()
    pressed = MemoryView("backlog.prep.1", WORKERS, "prep.1", int(0.95 * GiB), GiB, now - 100, 5)
    event = AutoscaleObserved((), quiet_for_s=0.0, memory=(pressed,))
    assert autoscale_pass.observed(state, event, now).commands  # due
    state.failover = FailoverRecord(tier=Tier.ROLE, role=WORKERS, reason="test", started_at=0.0)
    decided = autoscale_pass.observed(state, event, now)
    assert decided.changes == () and decided.commands == ()
    state.failover = None
    (began,) = autoscale_pass.observed(state, event, now).changes
    assert isinstance(began, RelaunchBegan)
    state.relaunch = began.record  # one in flight: no other begins
    again = MemoryView("backlog.prep.2", WORKERS, "prep.2", int(0.95 * GiB), GiB, now - 100, 5)
    assert autoscale_pass.observed(state, AutoscaleObserved((), 0.0, memory=(again,)), now).commands == ()
    state.relaunch = None


class _PlannedBrain(BrainPort):
    """A Brain that answers with the plans a test sets, and records what the job tells it."""

    def __init__(self) -> None:
        self.plans: list[RolePlan] = []
        self.outcomes: list[PlanOutcome] = []

    def job_started(self, job: JobRegistration) -> JobPlan | None:
        return None

    def report(self, samples: list[StatSample]) -> None:
        return None

    def plan(self) -> JobPlan | None:
        return JobPlan(job="autoscale", roles=list(self.plans))

    def plan_outcome(self, outcome: PlanOutcome) -> None:
        self.outcomes.append(outcome)

    def job_finished(self, outcome: str) -> None:
        return None

    @property
    def mode(self) -> BrainMode:
        return BrainMode.CLUSTER


def test_a_brain_memory_plan_relaunches_the_actor_under_pressure_and_is_reported_applied() -> None:
    brain = _PlannedBrain()
    spec = elastic_spec(1, 8, mode="cluster", brain_url="http://127.0.0.1:9", memory="2GiB")
    sim = AutoscaleSim(spec, brain=brain).with_steps(ElasticSteps(ELASTIC, 1.0, 0.04))
    brain.plans = [
        RolePlan(
            role=ELASTIC, memory_bytes=3 * GiB, algorithm="memory_relaunch", reason="near its limit", id=5
        )
    ]
    sim.run(30, until=lambda s: bool(brain.outcomes))
    assert [(o.plan_id, o.state) for o in brain.outcomes] == [(5, "unplaceable")]
    assert "no actor of role train is at 90% of its memory limit now" in brain.outcomes[0].reason
    sim.cluster.use_memory("autoscale.train.5", int(1.85 * GiB))
    brain.plans = [
        RolePlan(
            role=ELASTIC, memory_bytes=3 * GiB, algorithm="memory_relaunch", reason="near its limit", id=6
        )
    ]
    sim.run(60, until=lambda s: len(brain.outcomes) > 1)
    assert [(o.plan_id, o.state) for o in brain.outcomes][1] == (6, "applied")
    assert ("autoscale.train.5", 3 * GiB) in sim.cluster.replaced
    (_, message), *_ = _events(sim, EventKind.MEMORY_RELAUNCH)
    assert message.startswith("train.5 at 1.85 GiB of 2 GiB (92%): relaunched with 3 GiB (Brain plan #6")
    assert set(_faults_counted(sim)) == {0}
