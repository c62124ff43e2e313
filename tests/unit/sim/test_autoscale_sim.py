"""Auto-scaling wired into the PrimeManager, on the simulated cluster and clock: a decision
becomes a resize through the resize chain, none is taken during a failover or below a min, a
failover at the moment of a decision is counted once and defers it, and cluster mode executes
a real Brain's plans (and decides alone while the Brain is away)."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from dlu_api.cli.render import status_text
from dlu_api.status import JobStage
from dlu_api.vocabulary import EventKind, Tier
from dlu_brain import Brain, BrainDatabase, BrainServer
from dlu_prime.autoscale.policy import RoleView
from dlu_prime.brain_port import BrainClient, BrainMode, BrainPort
from dlu_prime.brain_port.models import JobPlan, JobRegistration, PlanOutcome, RolePlan, StatSample
from dlu_prime.master.change_types import Note
from dlu_prime.master.core import autoscale_pass
from dlu_prime.master.core.events import AutoscaleObserved
from dlu_prime.master.state import SUB_MASTER_RANK, FailoverRecord
from dlu_prime.testing.sim.autoscale_run import ELASTIC, WORKERS, AutoscaleSim, backlog_spec, elastic_spec
from dlu_prime.testing.sim.runner import run_seed
from dlu_prime.testing.sim.workloads import BurstyQueue, ElasticSteps

pytestmark = pytest.mark.timeout(120)


def trainer_sim(**kw: object) -> AutoscaleSim:
    spec = elastic_spec(1, 8, **kw)  # type: ignore[arg-type]
    return AutoscaleSim(spec).with_steps(ElasticSteps(ELASTIC, compute_s=1.0, comm_s=0.04))


def kinds(sim: AutoscaleSim) -> list[str]:
    return [str(e.kind) for e in sim.manager.state.events]


def nodes(sim: AutoscaleSim) -> int:
    ranks = [a for a in sim.manager.state.actors.values() if a.role == ELASTIC and a.rank != SUB_MASTER_RANK]
    return len(ranks)


def test_a_decision_becomes_a_resize_and_the_role_keeps_its_size() -> None:
    sim = trainer_sim()
    sim.run(200, until=lambda s: bool(s.trace.decisions))
    (when, decision) = sim.trace.decisions[0]
    assert decision.startswith("train 8 -> 7: 8 nodes ") and "steps/s" in decision
    assert when >= 25  # settle_s 5 + measure_s 20 of measurement at 8 nodes first
    sim.run(5)
    made = kinds(sim)
    at = made.index("autoscale_decision")
    assert made[at + 1 : at + 3] == ["resize_started", "resize_done"]
    started = next(e for e in sim.manager.state.events if e.kind == EventKind.RESIZE_STARTED)
    assert started.message.endswith("(autoscale)")
    assert nodes(sim) == 7 and sim.manager.state.roles[ELASTIC].target_nodes == 7
    sim.run(20)
    assert nodes(sim) == 7  # no growth back to MAX: the decision set the role's target


def test_the_statistics_show_in_status() -> None:
    sim = trainer_sim()
    sim.run(60)
    status = sim.manager.status()
    sizes = [t.world_size for t in status.throughput[ELASTIC]]
    assert 8 in sizes and all(t.steps_per_s and t.steps_per_s > 0 for t in status.throughput[ELASTIC])
    assert status.autoscale == "single-job"
    text = status_text(status)
    assert "statistics:" in text and f"{ELASTIC} speed by size: " in text and "autoscale: single-job" in text


def _view(current: int, low: int = 1) -> RoleView:
    return RoleView(ELASTIC, True, current, low, 8, {current: 2.0}, "steps/s")


def test_no_decision_during_a_failover_or_a_resize() -> None:
    sim = trainer_sim()
    sim.run(3)
    state = sim.manager.state
    event = AutoscaleObserved((_view(8),), quiet_for_s=1_000.0)
    assert autoscale_pass.observed(state, event, 0.0).changes  # due: 8 -> 7
    state.failover = FailoverRecord(tier=Tier.ROLE, role=ELASTIC, reason="test", started_at=0.0)
    decided = autoscale_pass.observed(state, event, 0.0)
    assert decided.changes == () and decided.commands == () and decided.reply is None
    plan = RolePlan(role=ELASTIC, size=4, algorithm="marginal_scaling", reason="r", id=1)
    assert autoscale_pass.observed(state, AutoscaleObserved((_view(8),), 1_000.0, (plan,)), 0.0).changes == ()


def test_no_decision_below_a_min_and_a_plan_below_it_is_refused_not_retried() -> None:
    sim = trainer_sim()
    sim.run(3)
    state = sim.manager.state
    at_min = AutoscaleObserved((RoleView(ELASTIC, True, 1, 1, 8, {1: 1.0, 2: 1.1}, "steps/s"),), 1_000.0)
    assert autoscale_pass.observed(state, at_min, 0.0).changes == ()
    plan = RolePlan(role=ELASTIC, size=0, algorithm="marginal_scaling", reason="r", id=7)
    decided = autoscale_pass.observed(state, AutoscaleObserved((_view(8),), 1_000.0, (plan,)), 0.0)
    (note,) = decided.changes
    assert isinstance(note, Note) and note.kind == EventKind.AUTOSCALE_PLAN_UNPLACEABLE
    assert "outside 1:8" in note.message and decided.commands == ()
    assert isinstance(decided.reply, autoscale_pass.Outcome) and decided.reply.error


def test_a_failover_at_the_moment_of_a_decision_is_counted_once_and_defers_it() -> None:
    sim = trainer_sim()
    due = sim.clock() + 25  # settle_s + measure_s at the first size
    while sim.clock() < due - 1:
        sim.step()
    assert not sim.trace.decisions
    victim = next(n for n, a in sim.manager.state.actors.items() if a.role == ELASTIC and a.rank == 3)
    sim.cluster.kill_actor(victim)  # dies as the decision falls due
    sim.step()
    sim.step()
    state = sim.manager.state
    assert state.roles[ELASTIC].restart_count == 1  # the one fault, counted once
    assert [str(e.kind) for e in state.events].count("failover_started") == 1
    assert not sim.trace.decisions  # deferred: the failover came first
    recovered = max(e.time for e in state.events if e.kind == EventKind.FAILOVER_DONE) - sim.started
    sim.run(60, until=lambda s: bool(s.trace.decisions))
    when, decision = sim.trace.decisions[0]
    assert when >= recovered + 25  # measured again, from after the recovery
    assert decision.startswith("train 8 -> 7")
    assert sim.manager.state.roles[ELASTIC].restart_count == 1


class _PlannedBrain(BrainPort):
    """A Brain that answers with the plans a test sets, and records what the job tells it."""

    def __init__(self) -> None:
        self.plans: list[RolePlan] = []
        self.outcomes: list[PlanOutcome] = []
        self.samples: list[StatSample] = []

    def job_started(self, job: JobRegistration) -> JobPlan | None:
        return None

    def report(self, samples: list[StatSample]) -> None:
        self.samples.extend(samples)

    def plan(self) -> JobPlan | None:
        return JobPlan(job="autoscale", roles=list(self.plans))

    def plan_outcome(self, outcome: PlanOutcome) -> None:
        self.outcomes.append(outcome)

    def job_finished(self, outcome: str) -> None:
        return None

    @property
    def mode(self) -> BrainMode:
        return BrainMode.CLUSTER


def test_a_plan_that_cannot_be_placed_is_reported_once_and_not_retried() -> None:
    brain = _PlannedBrain()
    spec = elastic_spec(1, 8, mode="cluster", brain_url="http://127.0.0.1:9")
    sim = AutoscaleSim(spec, brain=brain).with_steps(ElasticSteps(ELASTIC, 1.0, 0.04))
    brain.plans = [RolePlan(role=ELASTIC, size=4, algorithm="marginal_scaling", reason="smaller", id=1)]
    sim.run(15, until=lambda s: nodes(s) == 4)
    assert nodes(sim) == 4 and [(o.plan_id, o.state) for o in brain.outcomes] == [(1, "applied")]
    sim.cluster.placed_nodes = lambda role, ks, wait_s=0.0: [k for k in ks if k < 5]  # type: ignore[method-assign]
    brain.plans = [RolePlan(role=ELASTIC, size=6, algorithm="marginal_scaling", reason="larger", id=2)]
    sim.run(30, until=lambda s: len(brain.outcomes) > 1)
    assert [(o.plan_id, o.state) for o in brain.outcomes][1] == (2, "unplaceable")
    assert "could not be placed" in brain.outcomes[1].reason
    assert nodes(sim) == 4
    sim.run(30)
    assert len(brain.outcomes) == 2  # the same plan is not carried out again
    brain.plans = [RolePlan(role=ELASTIC, size=6, algorithm="marginal_scaling", reason="again", id=3)]
    sim.run(20, until=lambda s: len(brain.outcomes) > 2)
    assert (brain.outcomes[2].plan_id, brain.outcomes[2].state) == (3, "unplaceable")
    assert "failed before" in brain.outcomes[2].reason
    assert kinds(sim).count("resize_failed") == 1
    assert brain.samples and {s.kind for s in brain.samples} >= {"throughput"}


@pytest.fixture
def brain_server() -> Iterator[BrainServer]:
    db = BrainDatabase(f"sqlite:///{tempfile.mkdtemp()}/brain.sqlite")
    server = BrainServer(Brain(db))
    server.serve_in_thread()
    yield server
    server.shutdown()
    server.server_close()


def _finish(sim: AutoscaleSim) -> None:
    sim.cluster.finish([n for n, a in sim.manager.state.actors.items() if a.rank != SUB_MASTER_RANK])
    for _ in range(10):
        sim.step()
        if sim.manager.state.stage is JobStage.STOPPED:
            return
    raise AssertionError(f"the job did not end: {sim.manager.state.stage}")


def test_cluster_mode_executes_the_brains_plans_and_a_second_run_starts_at_the_best_size(
    brain_server: BrainServer,
) -> None:
    def run() -> AutoscaleSim:
        spec = elastic_spec(1, 8, mode="cluster", brain_url=brain_server.url, name="lm")
        sim = AutoscaleSim(spec)
        sim.autoscale.brain = BrainClient(brain_server.url, clock=sim.clock)
        return sim.with_steps(ElasticSteps(ELASTIC, compute_s=1.0, comm_s=0.04))

    first = run()
    first.run(400)
    assert first.autoscale.mode is BrainMode.CLUSTER
    assert first.trace.decisions and all(d.startswith("Brain plan #") for _, d in first.trace.decisions)
    settled = nodes(first)
    # where single-job mode settles too (the default threshold; a Brain that weighed the short
    # window after each resize as a full one read 4 nodes 4% slow and settled at 3)
    assert settled == 4
    _finish(first)
    second = run()
    second.run(5)
    when, decision = second.trace.decisions[0]
    assert "history_best_size" in decision and f"starts at {settled}" in decision
    assert when <= 2 and nodes(second) == settled


def test_in_cluster_mode_the_brain_sizes_with_the_jobs_own_threshold(brain_server: BrainServer) -> None:
    """The spec's marginal_threshold travels with the registration: a job asking for 70% settles
    where single-job mode with 70% does, not where the Brain's own 30% would take it."""
    alone = AutoscaleSim(elastic_spec(1, 8, threshold=0.7))
    alone.with_steps(ElasticSteps(ELASTIC, compute_s=1.0, comm_s=0.04)).run(400)
    spec = elastic_spec(1, 8, mode="cluster", threshold=0.7, brain_url=brain_server.url, name="strict")
    planned = AutoscaleSim(spec)
    planned.autoscale.brain = BrainClient(brain_server.url, clock=planned.clock)
    planned.with_steps(ElasticSteps(ELASTIC, compute_s=1.0, comm_s=0.04)).run(400)
    assert planned.autoscale.mode is BrainMode.CLUSTER
    assert all(d.startswith("Brain plan #") for _, d in planned.trace.decisions)
    assert nodes(planned) == nodes(alone) < 4  # 4: the default threshold's size (the test above)
    row = brain_server.brain.db.find_job("strict")
    assert row is not None and row.marginal_threshold == 0.7


def test_in_cluster_mode_the_brains_averages_are_the_jobs_own_measurements(
    brain_server: BrainServer,
) -> None:
    """The Brain's average speed at each size is the job's own meter's: the job sends a speed
    only after its settle window and once measured MIN_WINDOW_S at a size, so the Brain has no
    warm-up and no short window to weigh as a full one (with the settle window measured too, its
    average at 4 nodes was 4% off the job's). Where the Brain's 3 -> 4 read 32% of linear and single-job mode's 38%,
    the two had measured different windows of one curve (35% by the curve): noise, not a bias."""
    spec = elastic_spec(1, 8, mode="cluster", brain_url=brain_server.url, name="settled")
    sim = AutoscaleSim(spec)
    sim.autoscale.brain = BrainClient(brain_server.url, clock=sim.clock)
    sim.with_steps(ElasticSteps(ELASTIC, compute_s=1.0, comm_s=0.04)).run(300)
    job = brain_server.brain.db.find_job("settled")
    assert job is not None
    stored = brain_server.brain.db.throughput_by_size(job.id, "train")
    own = sim.autoscale.stats.meter.by_size("train")
    assert set(stored) == set(own) and len(own) >= 5  # 8 down to 3 and back to 4
    for size, speed in stored.items():
        assert speed == pytest.approx(own[size], rel=0.01), size


def test_in_cluster_mode_the_brain_sizes_a_backlog_role_with_the_jobs_own_target(
    brain_server: BrainServer,
) -> None:
    """The spec's backlog_target_s travels with the registration: the same burst of items on the
    same Brain gets more actors for a job asking for 5 s than for one asking for 60 s."""
    reached: dict[float, int] = {}
    for target in (5.0, 60.0):
        name = f"feed-{target:g}"
        spec = backlog_spec(2, 16, target_s=target, mode="cluster", name=name, brain_url=brain_server.url)
        queue = BurstyQueue("samples", WORKERS, 5.0, lambda t: 40.0 if t < 60 else 0.0)
        sim = AutoscaleSim(spec).with_queue(queue)
        sim.autoscale.brain = BrainClient(brain_server.url, clock=sim.clock)
        sim.run(120)
        assert sim.autoscale.mode is BrainMode.CLUSTER
        assert sim.trace.decisions and all(d.startswith("Brain plan #") for _, d in sim.trace.decisions)
        first = sim.trace.decisions[0][1]
        assert "backlog_sizing" in first and f"for {target:g} s" in first
        # the job's own drain rate (5 items/s per actor while it has work), not its steps/s (1)
        assert "at 5.0/s per actor" in first, first
        reached[target] = max(size for _, size in sim.trace.sizes)
        row = brain_server.brain.db.find_job(name)
        assert row is not None and row.backlog_target_s == target
    assert reached[5.0] == 16 and 4 <= reached[60.0] < 16, reached  # ~930 waiting: 38 (bounded), 4


def test_with_the_brain_away_the_job_decides_alone_and_buffers_its_statistics() -> None:
    spec = elastic_spec(1, 8, mode="cluster", brain_url="http://127.0.0.1:9")  # nothing listens
    sim = AutoscaleSim(spec)
    client = BrainClient("http://127.0.0.1:9", clock=sim.clock)
    sim.autoscale.brain = client
    sim.with_steps(ElasticSteps(ELASTIC, compute_s=1.0, comm_s=0.04)).run(
        60, until=lambda s: bool(s.trace.decisions)
    )
    assert client.mode is BrainMode.SINGLE_JOB
    assert sim.trace.decisions[0][1].startswith("train 8 -> 7")  # the job's own policy
    assert client.buffered > 0 and client.dropped == 0


def test_soak_a_settled_job_and_a_job_with_autoscale_off_do_nothing() -> None:
    settled = trainer_sim()
    settled.run(400)
    made = len(settled.trace.decisions)
    assert made and nodes(settled) == 4  # the default threshold's size: 97% of the fastest (5)
    settled.run(40 * 25)  # forty settle-and-measure windows more
    assert len(settled.trace.decisions) == made and nodes(settled) == 4
    off = trainer_sim(mode="off")
    off.run(1000)
    assert "autoscale_decision" not in kinds(off) and "resize_started" not in kinds(off)
    assert nodes(off) == 8 and off.manager.status().throughput[ELASTIC]  # measured all the same


@pytest.mark.timeout(600)
def test_seeded_runs_with_autoscale_among_the_faults_hold_every_invariant() -> None:
    """The simulator's seeded interleavings of every fault, with the job auto-scaling among them
    (settle 2 s, measure 3 s): every fault counted once, the limits, the stored state, the end."""
    results = [run_seed(s, fault_steps=20, quiet_steps=30, autoscale=True) for s in range(150)]
    bad = [r for r in results if r.violation]
    assert not bad, "\n".join([f"seed {bad[0].seed}: {bad[0].violation}", *bad[0].trace])
    decided = sum(1 for r in results for line in r.trace if "autoscale_decision" in line)
    assert decided > 50  # the decisions really happened among the faults


class _BrainProcess:
    """`python -m dlu_brain` on a port, killed with SIGKILL (a Brain that dies, connections too)."""

    def __init__(self, db: str, port: int, log: Path) -> None:
        self.db, self.port, self.log = db, port, log
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with open(self.log, "wb") as out:  # a fresh log: it says when this process serves
            cmd = [sys.executable, "-m", "dlu_brain", "--db", self.db, "--port", str(self.port)]
            self.proc = subprocess.Popen(cmd, stdout=out, stderr=out)
        deadline = time.monotonic() + 60
        while f"Brain serving at http://127.0.0.1:{self.port}" not in self.log.read_text(errors="replace"):
            assert self.proc.poll() is None and time.monotonic() < deadline, self.log.read_text()
            time.sleep(0.1)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(timeout=30)


def test_a_brain_killed_and_restarted_loses_no_statistics(tmp_path: Path) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = int(probe.getsockname()[1])
    db = f"sqlite:///{tmp_path}/brain.sqlite"
    brain = _BrainProcess(db, port, tmp_path / "brain.log")
    brain.start()
    try:
        url = f"http://127.0.0.1:{port}"
        sim = AutoscaleSim(elastic_spec(1, 8, mode="cluster", brain_url=url, name="lm"))
        client = BrainClient(url, clock=sim.clock)
        sim.autoscale.brain = client
        sim.with_steps(ElasticSteps(ELASTIC, compute_s=1.0, comm_s=0.04))
        sim.run(40)
        assert client.mode is BrainMode.CLUSTER and sim.trace.decisions[0][1].startswith("Brain plan #")
        brain.kill()
        sim.run(120)  # the Brain is gone: the job decides alone, its statistics wait
        assert client.mode is BrainMode.SINGLE_JOB and client.buffered > 0
        assert any(not d.startswith("Brain plan") for _, d in sim.trace.decisions)
        shown = sim.manager.status().autoscale or ""
        assert shown.startswith("cluster: the Brain is away, the job decides alone") and "buffered" in shown
        brain.start()
        sim.run(60, until=lambda s: client.buffered == 0 and client.mode is BrainMode.CLUSTER)
        assert client.mode is BrainMode.CLUSTER and client.buffered == 0, (client.last_error, client.buffered)
        assert client.dropped == 0
        assert sim.manager.status().autoscale == "cluster: executing the Brain's plans"
        stored = BrainDatabase(db)
        job = stored.find_job("lm")
        assert job is not None
        sizes = set(stored.throughput_by_size(job.id, ELASTIC))
        decided = {int(d.split(" -> ")[0].split()[-1]) for _, d in sim.trace.decisions if " -> " in d}
        assert decided <= sizes  # every size the job decided from, while the Brain was away too, reached it
    finally:
        brain.kill()


def test_the_brain_gets_a_simple_roles_total_speed_and_the_role_behind_a_backlog() -> None:
    from dlu_prime.testing.sim.autoscale_run import WORKERS, backlog_spec
    from dlu_prime.testing.sim.workloads import BurstyQueue

    brain = _PlannedBrain()
    spec = backlog_spec(3, 8)
    sim = AutoscaleSim(spec, brain=brain).with_queue(BurstyQueue("samples", WORKERS, 5.0, lambda t: 100.0))
    sim.run(12)  # no decision yet (settle 5 s + measure 10 s): three actors all along
    speeds = [s for s in brain.samples if s.kind == "throughput" and s.role == WORKERS]
    assert speeds and all(s.world_size == 3 and s.steps_per_s == pytest.approx(3.0) for s in speeds)
    backlogs = [s for s in brain.samples if s.kind == "backlog"]
    assert backlogs and {s.role for s in backlogs} == {WORKERS}
