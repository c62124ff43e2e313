"""The Brain in one process on SQLite: first plans from history, optimize events, unplaceable
plans reported and not proposed again, and a restarted Brain resuming its administrators."""

from __future__ import annotations

from pathlib import Path

import pytest

from dlu_brain import AdminSettings, Brain, BrainDatabase, OptimizerSettings
from dlu_prime.brain_port import JobRegistration, PlanOutcome, RolePlan, RoleShape, StatSample

pytestmark = pytest.mark.timeout(60)
COMM = {n: 1.0 / (1.0 / n + 0.02 * n) for n in range(1, 9)}  # compute / N + comm x N: best at 7


def reg(run: str, name: str = "lm", threshold: float | None = None) -> JobRegistration:
    shape = RoleShape(kind="elastic", size=2, min_size=1, max_size=8, elastic=True, actors_per_unit=2,
                      actor_resources={"CPU": 1.0})  # fmt: skip
    return JobRegistration(
        name=name, run_id=run, roles={"trainer": shape}, entrypoint="train:main", config_hash="x",
        marginal_threshold=threshold,
    )  # fmt: skip


def speeds(seq0: int, size: int, value: float, n: int = 3) -> list[StatSample]:
    return [StatSample(seq=seq0 + i, time=float(seq0 + i), kind="throughput", role="trainer", world_size=size,
                       samples_per_s=value) for i in range(n)]  # fmt: skip


def measure_and_apply(brain: Brain, name: str, sizes: list[int]) -> RolePlan:
    """The job runs each size in turn (the COMM curve) and applies each plan, as its master
    does; the plan after the last size."""
    for size in sizes:
        brain.add_samples(name, "r1", speeds(10 * size, size, 100.0 * COMM[size]))
        (plan,) = brain.plan(name, "r1").roles
        if size != sizes[-1]:
            assert plan.size == size + 1 and plan.id is not None, plan.reason
            brain.plan_outcome(name, PlanOutcome(run_id="r1", plan_id=plan.id, state="applied"))
    return plan


@pytest.fixture
def brain(tmp_path: Path) -> Brain:
    made = Brain(BrainDatabase(f"sqlite:///{tmp_path / 'brain.sqlite'}"), AdminSettings(min_samples=3))
    made.resume()
    return made


def test_a_new_job_starts_at_the_size_that_was_best_last_time(brain: Brain) -> None:
    assert brain.start_job(reg("r1")).roles == []  # no history yet
    seq = 1
    for size in range(1, 9):
        brain.add_samples("lm", "r1", speeds(seq, size, COMM[size]))
        seq += 3
    brain.end_job("lm", "r1", "succeeded")
    first = brain.start_job(reg("r2")).roles
    # the default threshold (30% of linear): 5 nodes, 94% of the fastest (7); a 6th brings 23% of linear
    assert [(p.role, p.size, p.algorithm) for p in first] == [("trainer", 5, "history_best_size")]
    assert "best of finished runs" in first[0].reason and COMM[5] >= 0.9 * COMM[7]
    other = brain.start_job(reg("r1", name="other")).roles  # another name, same signature
    assert [p.size for p in other] == [5]


def test_the_brains_threshold_is_its_own_setting(tmp_path: Path) -> None:
    strict = Brain(
        BrainDatabase(f"sqlite:///{tmp_path / 'brain.sqlite'}"),
        AdminSettings(min_samples=3),
        optimizer_settings=OptimizerSettings(linear_threshold=0.7),
    )
    strict.resume()
    strict.start_job(reg("r1"))
    for size in range(1, 9):
        strict.add_samples("lm", "r1", speeds(1 + 3 * (size - 1), size, COMM[size]))
    strict.end_job("lm", "r1", "succeeded")
    assert [p.size for p in strict.start_job(reg("r2")).roles] == [3]  # 3 -> 4 keeps 58% of linear
    # a job that sends its own threshold is planned with it, from the same history
    (own,) = strict.start_job(reg("r3", threshold=0.3)).roles
    assert own.size == 5 and "threshold 30% of linear" in own.reason


def test_two_jobs_with_different_thresholds_get_different_plans_from_one_curve(tmp_path: Path) -> None:
    brain = Brain(
        BrainDatabase(f"sqlite:///{tmp_path / 'brain.sqlite'}"),
        AdminSettings(min_samples=3),
        optimizer_settings=OptimizerSettings(linear_threshold=0.7),
    )
    brain.resume()
    jobs = {"eager": 0.3, "strict": 0.7, "older": None}  # older: registered without a threshold
    plans: dict[str, RolePlan] = {}
    for name, threshold in jobs.items():
        brain.start_job(reg("r1", name=name, threshold=threshold))
        # the same measured curve for each: 2 -> 3 keeps 75% of linear, 3 -> 4 keeps 58%
        plans[name] = measure_and_apply(brain, name, [2, 3, 4])
    assert {n: (p.size, p.algorithm) for n, p in plans.items()} == {
        "eager": (5, "marginal_scaling"),  # 58% >= 30%: grow on
        "strict": (3, "marginal_scaling"),  # 58% < 70%: back to 3
        "older": (3, "marginal_scaling"),  # the Brain's own 70%
    }
    assert "(< 70%)" in plans["strict"].reason and "(< 70%)" in plans["older"].reason
    status = {j["name"]: j["marginal_threshold"] for j in brain.status()["jobs"]}
    assert status == {"eager": 0.3, "strict": 0.7, "older": 0.7}


def test_measured_sizes_drive_marginal_scaling(brain: Brain) -> None:
    brain.start_job(reg("r1"))
    brain.add_samples("lm", "r1", speeds(1, 2, 100.0))
    plan = {p.role: p for p in brain.plan("lm", "r1").roles}
    assert plan["trainer"].size == 3 and plan["trainer"].algorithm == "marginal_scaling"
    job = brain.db.find_job("lm", "r1")
    assert job is not None
    kinds = [e.kind for e in brain.db.events(job.id)]
    assert kinds == ["job_start", "throughput_measured"]


def test_throughput_drop_and_memory_pressure_raise_events_once(brain: Brain) -> None:
    brain.start_job(reg("r1"))
    brain.add_samples("lm", "r1", speeds(1, 2, 100.0, n=4))
    brain.add_samples("lm", "r1", speeds(10, 2, 40.0, n=3))  # dropped, three times: one event
    mem = StatSample(seq=20, time=20.0, kind="resource", role="trainer", actor="trainer-0",
                     memory_bytes=95, memory_limit_bytes=100)  # fmt: skip
    brain.add_samples("lm", "r1", [mem, mem.model_copy(update={"seq": 21})])
    job = brain.db.find_job("lm", "r1")
    assert job is not None
    kinds = [e.kind for e in brain.db.events(job.id)]
    assert kinds.count("throughput_drop") == 1 and kinds.count("memory_pressure") == 1
    plans = [p for p in brain.db.plans(job.id) if p.algorithm == "memory_relaunch"]
    assert [p.memory_bytes for p in plans] == [150]


def test_a_plan_that_cannot_be_placed_is_reported_and_not_retried(brain: Brain) -> None:
    brain.start_job(reg("r1"))
    brain.cluster_sample(1, 0, {"CPU": 4.0}, {"CPU": 1.0}, [])  # one node more needs 2 CPU
    brain.add_samples("lm", "r1", speeds(1, 2, 100.0))
    job = brain.db.find_job("lm", "r1")
    assert job is not None
    (plan,) = [p for p in brain.db.plans(job.id) if p.algorithm == "marginal_scaling"]
    assert plan.state == "unplaceable" and "CPU needs 2, 1 free" in plan.reason
    for n in range(10):  # the same condition again and again: no new plan for that size
        brain.cluster_sample(1, 0, {"CPU": 4.0}, {"CPU": 1.0}, [])
        brain.add_samples("lm", "r1", speeds(100 + 10 * n, 2, 100.0))
    assert len([p for p in brain.db.plans(job.id) if p.size == 3]) == 1


def test_the_jobs_own_unplaceable_report_stops_the_proposal(brain: Brain) -> None:
    brain.start_job(reg("r1"))
    brain.add_samples("lm", "r1", speeds(1, 2, 100.0))
    (plan,) = brain.plan("lm", "r1").roles
    assert plan.id is not None and plan.state == "proposed"
    brain.plan_outcome("lm", PlanOutcome(run_id="r1", plan_id=plan.id, state="unplaceable", reason="no node"))
    (now,) = brain.plan("lm", "r1").roles
    assert now.state == "unplaceable" and now.reason.endswith("[unplaceable: no node]")
    brain.add_samples("lm", "r1", speeds(10, 2, 20.0, n=2))  # a throughput drop: a new event
    job = brain.db.find_job("lm", "r1")
    assert job is not None
    assert "throughput_drop" in [e.kind for e in brain.db.events(job.id)]
    assert [p.size for p in brain.db.plans(job.id)] == [3]  # not proposed again


def test_a_restarted_brain_keeps_each_jobs_threshold(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'brain.sqlite'}"
    first = Brain(BrainDatabase(url), AdminSettings(min_samples=3))
    first.resume()
    first.start_job(reg("r1", threshold=0.7))
    grow = measure_and_apply(first, "lm", [2, 3])
    assert grow.size == 4 and grow.id is not None
    first.plan_outcome("lm", PlanOutcome(run_id="r1", plan_id=grow.id, state="applied"))
    first.add_samples("lm", "r1", speeds(40, 4, 100.0 * COMM[4], n=2))  # 4 nodes not measured yet
    first.db.close()
    again = Brain(BrainDatabase(url), AdminSettings(min_samples=3))  # its own setting: 30%
    again.resume()
    again.add_samples("lm", "r1", speeds(42, 4, 100.0 * COMM[4], n=1))  # the third: measured
    (plan,) = again.plan("lm", "r1").roles
    assert plan.size == 3 and "(< 70%)" in plan.reason  # the job's 70%, read back from the database


def test_a_restarted_brain_resumes_every_administrator(brain: Brain, tmp_path: Path) -> None:
    brain.start_job(reg("r1"))
    brain.start_job(reg("r1", name="second"))
    brain.add_samples("lm", "r1", speeds(1, 2, 100.0, n=4))
    brain.cluster_sample(1, 0, {"CPU": 16.0}, {"CPU": 8.0}, [])  # room for more: idle_resources
    brain.db.close()
    again = Brain(BrainDatabase(f"sqlite:///{tmp_path / 'brain.sqlite'}"), AdminSettings(min_samples=3))
    assert again.resume() == 2
    assert again.start_job(reg("r1")).roles  # the restarted master registers again: same job
    again.add_samples("lm", "r1", speeds(1, 2, 100.0, n=4))  # resent: stored once, no new event
    again.add_samples("lm", "r1", speeds(50, 2, 30.0))  # the drop is judged against the resumed best
    again.cluster_sample(1, 0, {"CPU": 16.0}, {"CPU": 8.0}, [])  # the same room: raised already
    job = again.db.find_job("lm", "r1")
    assert job is not None
    kinds = [e.kind for e in again.db.events(job.id)]
    assert kinds == ["job_start", "throughput_measured", "idle_resources", "throughput_drop"]
    assert len(again.db.samples(job.id)) == 7
