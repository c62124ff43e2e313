"""The contract every Brain database backend meets, as one pytest suite (SQLite and PostgreSQL
both run it: tests/conformance/test_brain_db_*.py).

    class TestMyBackend(BrainDatabaseConformance):
        def create_database(self, tmp_path: Path) -> BrainDatabase:
            return BrainDatabase("...")  # an empty database
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

try:
    import pytest
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError(
        "dlu_brain.testing.db_conformance runs under pytest: install dlu-brain[testing]"
    ) from exc

import sqlalchemy as sa
from sqlalchemy.exc import IntegrityError

from dlu_brain.administrator import AdminSettings
from dlu_brain.db import LATEST, AppliedSize, BrainDatabase, JobRow, SchemaTooNewError
from dlu_brain.service import Brain
from dlu_prime.brain_port import JobRegistration, RolePlan, RoleShape, StatSample

__all__ = ["BrainDatabaseConformance", "registration"]


def registration(name: str = "job", run_id: str = "run-1", entrypoint: str = "train:main") -> JobRegistration:
    return JobRegistration(
        name=name,
        run_id=run_id,
        roles={"trainer": RoleShape(kind="elastic", size=2, min_size=1, max_size=8, elastic=True)},
        entrypoint=entrypoint,
        config_hash="c0ffee",
    )


def speed(seq: int, size: int, per_s: float, t: float | None = None, role: str = "trainer") -> StatSample:
    return StatSample(seq=seq, time=t if t is not None else float(seq), kind="throughput", role=role,
                      world_size=size, samples_per_s=per_s)  # fmt: skip


class BrainDatabaseConformance:
    """Not collected by itself (no `Test` prefix); every subclass runs all of it on an empty database."""

    def create_database(self, tmp_path: Path) -> BrainDatabase:
        raise NotImplementedError(f"{type(self).__name__} must override create_database(tmp_path)")

    @pytest.fixture
    def db(self, tmp_path: Path) -> Iterator[BrainDatabase]:
        made = self.create_database(tmp_path)
        made.migrate()
        try:
            yield made
        finally:
            made.close()

    def test_migrate_reaches_latest_and_is_idempotent(self, db: BrainDatabase) -> None:
        assert db.migrate() == LATEST
        assert db.migrate() == LATEST
        with db.engine.connect() as conn:
            versions = (
                conn.execute(sa.text("SELECT version FROM dlu_schema_version ORDER BY version"))
                .scalars()
                .all()
            )
        assert versions == list(range(1, LATEST + 1))

    def test_a_newer_schema_is_refused(self, db: BrainDatabase) -> None:
        with db.engine.begin() as conn:
            conn.execute(
                sa.text(
                    "INSERT INTO dlu_schema_version (version, description, applied_at) VALUES (:v, 'future', 0)"
                ),
                {"v": LATEST + 1},
            )
        with pytest.raises(SchemaTooNewError, match="upgrade dlu-brain"):
            db.migrate()

    def test_register_is_idempotent_per_run(self, db: BrainDatabase) -> None:
        first = db.register_job(registration(), now=10)
        assert db.register_job(registration(), now=11) == first
        second = db.register_job(registration(run_id="run-2"), now=12)
        assert second != first
        row = db.job(first)
        assert row is not None
        assert (row.name, row.run_id, row.started_at, row.ended_at) == ("job", "run-1", 10, None)
        assert row.signature == registration().signature
        assert row.roles["trainer"]["max_size"] == 8
        newest = db.find_job("job")
        assert newest is not None and newest.run_id == "run-2"
        assert db.find_job("nobody") is None

    def test_the_jobs_threshold_is_stored_or_left_out(self, db: BrainDatabase) -> None:
        own = db.register_job(registration("own").model_copy(update={"marginal_threshold": 0.7}))
        older = db.register_job(registration("older"))  # a job that sends none (the Brain's own)
        assert [(j.name, j.marginal_threshold) for j in db.running_jobs()] == [("own", 0.7), ("older", None)]
        assert (db.job(own) or _absent()).marginal_threshold == 0.7
        assert (db.job(older) or _absent()).marginal_threshold is None

    def test_the_jobs_backlog_target_is_stored_or_left_out(self, db: BrainDatabase) -> None:
        own = db.register_job(registration("own").model_copy(update={"backlog_target_s": 5.0}))
        older = db.register_job(registration("older"))
        assert [(j.name, j.backlog_target_s) for j in db.running_jobs()] == [("own", 5.0), ("older", None)]
        assert (db.job(own) or _absent()).backlog_target_s == 5.0
        assert (db.job(older) or _absent()).backlog_target_s is None

    def test_a_short_backlog_target_gets_more_actors_than_a_long_one(self, db: BrainDatabase) -> None:
        """The Brain on this backend plans each job's backlog role with the job's own target."""
        brain = Brain(db, AdminSettings(min_samples=3))
        prep = RoleShape(kind="simple", size=1, min_size=1, max_size=32)
        sizes: dict[str, int | None] = {}
        for name, target in (("short", 5.0), ("long", 60.0), ("older", None)):
            brain.start_job(JobRegistration(name=name, run_id="r1", roles={"prep": prep}, entrypoint="p:m",
                                            config_hash="c", backlog_target_s=target))  # fmt: skip
            waiting = StatSample(seq=1, time=0, kind="backlog", channel="q", role="prep", backlog=300)
            measured = [StatSample(seq=2 + i, time=1 + i, kind="throughput", role="prep", world_size=1,
                                   steps_per_s=2.0) for i in range(3)]  # fmt: skip
            brain.add_samples(name, "r1", [waiting, *measured])
            (plan,) = brain.plan(name, "r1").roles
            assert plan.algorithm == "backlog_sizing", plan.reason
            sizes[name] = plan.size
        # 300 waiting at 2/s per actor: 30 actors drain it in 5 s, 3 in 60 s, 5 in the Brain's 30 s
        assert sizes == {"short": 30, "long": 3, "older": 5}

    def test_plan_answers_are_stored_with_when_they_came(self, db: BrainDatabase) -> None:
        job = db.register_job(registration())
        quiet = db.register_job(registration("quiet"))  # no sample yet when it answers
        db.add_samples(job, [speed(5, 2, 100.0), speed(9, 2, 100.0)])
        grow = db.add_plan(job, RolePlan(role="trainer", size=3, algorithm="marginal_scaling", reason="grow"))
        db.acknowledge_plan(job, grow, "applied", now=10)
        assert db.applied_sizes(job) == {"trainer": AppliedSize("trainer", 3, grow, 9)}
        big = db.add_plan(job, RolePlan(role="trainer", size=8, algorithm="marginal_scaling", reason="big"))
        db.acknowledge_plan(job, big, "unplaceable", "GPU needs 8, 2 free", now=11)
        assert db.applied_sizes(job) == {"trainer": AppliedSize("trainer", 3, grow, 9)}  # not applied
        assert [(p.id, p.state) for p in db.plans(job)][-1] == (big, "unplaceable")
        assert db.plans(job)[-1].reason == "big [unplaceable: GPU needs 8, 2 free]"
        db.add_samples(job, [speed(12, 3, 150.0)])
        again = db.add_plan(job, RolePlan(role="trainer", size=4, algorithm="marginal_scaling", reason="on"))
        db.acknowledge_plan(job, again, "applied", now=12)
        assert db.applied_sizes(job) == {"trainer": AppliedSize("trainer", 4, again, 12)}
        first = db.add_plan(
            quiet, RolePlan(role="trainer", size=4, algorithm="history_best_size", reason="h")
        )
        db.acknowledge_plan(quiet, first, "applied")
        assert db.applied_sizes(quiet) == {"trainer": AppliedSize("trainer", 4, first, -1)}

    def test_running_and_finished_jobs(self, db: BrainDatabase) -> None:
        a = db.register_job(registration("a"), now=1)
        b = db.register_job(registration("b"), now=2)
        c = db.register_job(registration("c", entrypoint="other:main"), now=3)
        db.end_job(a, "succeeded", now=5)
        db.end_job(b, "failed", now=6)
        db.end_job(b, "succeeded", now=7)  # an end is recorded once
        assert [j.name for j in db.running_jobs()] == ["c"]
        assert [(j.name, j.outcome, j.ended_at) for j in db.finished_jobs()] == [
            ("b", "failed", 6),
            ("a", "succeeded", 5),
        ]
        assert [j.name for j in db.finished_jobs(signature=registration().signature)] == ["b", "a"]
        assert db.finished_jobs(signature=registration(entrypoint="other:main").signature) == []
        assert c

    def test_samples_are_stored_once_and_read_back_whole(self, db: BrainDatabase) -> None:
        job = db.register_job(registration())
        resource = StatSample(seq=3, time=3.0, kind="resource", role="trainer", actor="trainer-0", node_id="n1",
                              cpu_percent=150.5, memory_bytes=5 * 2**30, memory_limit_bytes=8 * 2**30,
                              gpu_percent=90.0, gpu_memory_bytes=2**34)  # fmt: skip
        backlog = StatSample(
            seq=4, time=4.0, kind="backlog", channel="rollouts", backlog=1200, role="rollout"
        )
        batch = [speed(1, 2, 100.0), speed(2, 2, 110.0), resource, backlog]
        assert len(db.add_samples(job, batch)) == 4
        assert db.add_samples(job, batch) == []  # sent again after a lost answer
        assert [s.seq for s in db.add_samples(job, [*batch, speed(5, 4, 180.0)])] == [5]
        assert db.samples(job) == [*batch, speed(5, 4, 180.0)]
        assert db.samples(job, kind="backlog") == [backlog]
        assert [s.seq for s in db.samples(job, since=3.5)] == [4, 5]
        assert [s.seq for s in db.samples(job, limit=2)] == [4, 5]
        assert db.throughput_by_size(job, "trainer") == {2: pytest.approx(105.0), 4: pytest.approx(180.0)}
        assert db.throughput_by_size(job, "nobody") == {}

    def test_steps_per_second_stand_in_for_samples(self, db: BrainDatabase) -> None:
        job = db.register_job(registration())
        db.add_samples(
            job, [StatSample(seq=1, time=1, kind="throughput", role="trainer", world_size=3, steps_per_s=2.5)]
        )
        assert db.throughput_by_size(job, "trainer") == {3: pytest.approx(2.5)}

    def test_samples_are_per_job(self, db: BrainDatabase) -> None:
        a = db.register_job(registration("a"))
        b = db.register_job(registration("b"))
        db.add_samples(a, [speed(1, 2, 10.0)])
        assert len(db.add_samples(b, [speed(1, 2, 20.0)])) == 1  # the same seq in another job
        assert db.throughput_by_size(b, "trainer") == {2: pytest.approx(20.0)}

    def test_events_and_their_states(self, db: BrainDatabase) -> None:
        job = db.register_job(registration())
        first = db.add_event(job, "job_start", None, {"roles": ["trainer"]}, now=1)
        second = db.add_event(job, "throughput_drop", "trainer", {"world_size": 4, "best": 10.5}, now=2)
        db.set_event_state(first, "planned")
        assert [(e.kind, e.role, e.state) for e in db.events(job)] == [
            ("job_start", None, "planned"),
            ("throughput_drop", "trainer", "open"),
        ]
        assert [e.id for e in db.events(job, state="open")] == [second]
        assert db.events(job)[1].detail == {"world_size": 4, "best": 10.5}

    def test_plans_supersede_and_record_outcomes(self, db: BrainDatabase) -> None:
        job = db.register_job(registration())
        event = db.add_event(job, "job_start", None, {})
        one = db.add_plan(
            job, RolePlan(role="trainer", size=4, algorithm="history_best_size", reason="best"), event
        )
        two = db.add_plan(job, RolePlan(role="trainer", size=6, algorithm="marginal_scaling", reason="grow"))
        db.add_plan(
            job, RolePlan(role="reader", memory_bytes=2**31, algorithm="memory_relaunch", reason="oom")
        )
        db.set_plan_state(two, "unplaceable", "GPU needs 8, 2 free")
        states = [(p.id, p.size, p.state) for p in db.plans(job)]
        assert states[:2] == [(one, 4, "superseded"), (two, 6, "unplaceable")]
        current = {p.role: p for p in db.current_plans(job)}
        assert current["trainer"].reason == "grow [unplaceable: GPU needs 8, 2 free]"
        assert current["reader"].memory_bytes == 2**31 and current["reader"].state == "proposed"

    def test_cluster_samples(self, db: BrainDatabase) -> None:
        assert db.latest_cluster_sample() is None
        db.add_cluster_sample(2, 1, {"CPU": 16.0}, {"CPU": 4.5}, [{"GPU": 1.0}], now=1)
        db.add_cluster_sample(3, 0, {"CPU": 24.0}, {"CPU": 12.0}, [], now=2)
        latest = db.latest_cluster_sample()
        assert latest is not None
        assert (latest["nodes_alive"], latest["available"], latest["pending_demand"]) == (
            3,
            {"CPU": 12.0},
            [],
        )

    def test_a_sample_of_an_unknown_job_is_refused(self, db: BrainDatabase) -> None:
        """Foreign keys are on: a sample for a job that does not exist is refused."""
        with pytest.raises(IntegrityError):
            db.add_samples(424242, [speed(1, 2, 1.0)])

    def test_concurrent_writers_lose_nothing(self, db: BrainDatabase) -> None:
        job = db.register_job(registration())
        errors: list[BaseException] = []

        def write(offset: int) -> None:
            try:
                for i in range(20):
                    db.add_samples(job, [speed(offset * 1000 + i, 2, 1.0)])
            except BaseException as exc:
                errors.append(exc)

        threads = [threading.Thread(target=write, args=(n,)) for n in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=120)
        assert errors == []
        assert len(db.samples(job)) == 80


def _absent() -> JobRow:
    raise AssertionError("a job just registered is not in the database")
