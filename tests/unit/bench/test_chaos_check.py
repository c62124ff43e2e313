"""The chaos campaign's checker on synthetic timelines: one recovery event per fault naming its
culprit passes; a peer blamed, an extra or missing recovery, a loss mismatch, a leak, lost or
duplicated records and a wrong limit stop each fail, and say what they saw."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

BENCHMARKS = str(Path(__file__).resolve().parents[3] / "benchmarks")
if BENCHMARKS not in sys.path:
    sys.path.insert(0, BENCHMARKS)

from chaos_check import Injected, LimitCheck, LossCheck, RecordCount, account, check  # noqa: E402

from dlu_api.status import JobEvent, JobStage, JobStatus  # noqa: E402

pytestmark = pytest.mark.timeout(30)

JOB = "lm"
R = [f"lm.trainer.{k}" for k in range(4)]
SUB = "lm.trainer.submaster"
DONE = {JOB: JobStatus(name=JOB, stage=JobStage.STOPPED, exit_code=0)}


def fault(
    kind: str, at: float, actor: str | None = None, settled: float | None = None, **more: object
) -> Injected:
    return Injected(kind, JOB, at, actor=actor, settled_at=at + 8 if settled is None else settled, **more)  # type: ignore[arg-type]


def ev(
    kind: str, at: float, actor: str | None = None, tier: str | None = None, node: str | None = None
) -> JobEvent:
    return JobEvent(time=at, kind=kind, message=f"{kind} of {actor}", actor=actor, tier=tier, node_id=node)


def test_one_recovery_per_fault_naming_the_culprit_passes() -> None:
    faults = [
        fault("proc_crash", 100, R[1]),
        fault("proc_hang", 200, R[2]),
        fault("worker_kill", 300, R[3]),
        fault("elastic_master_kill", 400, SUB),
        fault("prime_master_kill", 500, "lm.prime-master"),
    ]
    events = [
        ev("job_created", 1),
        ev("inplace_restart", 100.5, R[1], "in_place"),
        ev("failover_done", 101, R[1]),  # not a recovery event: never counted
        ev("inplace_restart", 206, R[2], "in_place"),
        ev("failover_started", 301, R[3], "role"),
        ev("failover_started", 401, SUB, "sub_master"),
        ev("master_restarted", 502, None, "master"),
    ]
    report = check(faults, {JOB: events}, DONE, loss=LossCheck("2.1", "2.1"), seed=1)
    assert report.ok, report.problems()
    assert len(report.accounting.recovered) == 5
    assert report.tiers()["proc_hang"] == {"in_place": 1}
    assert report.lines()[-1] == "PASS"


def test_a_peer_blamed_for_a_crash_is_mis_attributed() -> None:
    faults = [fault("proc_crash", 100, R[1])]
    events = [ev("inplace_restart", 100.5, R[1], "in_place"), ev("inplace_restart", 100.6, R[0], "in_place")]
    report = check(faults, {JOB: events}, DONE)
    assert not report.ok
    (wrong,) = report.accounting.mis_attributed
    assert wrong[1].actor == R[0]
    assert any(
        p.startswith("MIS-ATTRIBUTED: proc_crash on lm.trainer.1") and "actor=lm.trainer.0" in p
        for p in report.problems()
    )


def test_an_unnamed_recovery_is_mis_attributed_and_the_fault_missed() -> None:
    report = check(
        [fault("worker_kill", 100, R[2])], {JOB: [ev("failover_started", 101, None, "role")]}, DONE
    )
    assert len(report.accounting.mis_attributed) == 1 and len(report.accounting.missed) == 1
    assert any(p.startswith("MISSED: worker_kill on lm.trainer.2") for p in report.problems())


def test_a_recovery_outside_every_window_is_spurious() -> None:
    faults = [fault("proc_crash", 100, R[1], settled=105)]
    events = [
        ev("inplace_restart", 101, R[1], "in_place"),
        ev("failover_started", 150, R[0], "role"),
        ev("inplace_restart", 20, None),
    ]
    accounting = account(faults, {JOB: events}, grace_s=5)
    assert [e.time for _, e in accounting.spurious] == [20, 150]
    assert len(accounting.recovered) == 1


def test_two_recoveries_of_one_fault_are_duplicated() -> None:
    report = check(
        [fault("worker_kill", 100, R[1])],
        {JOB: [ev("failover_started", 101, R[1]), ev("failover_started", 104, R[1])]},
        DONE,
    )
    (dup,) = report.accounting.duplicated
    assert len(dup[1]) == 2 and not report.ok


def test_prime_master_twice_in_a_row_needs_two_restarts() -> None:
    first = fault("prime_master_kill", 100, "lm.prime-master", settled=103)
    second = fault("prime_master_kill", 103.1, "lm.prime-master", settled=110)
    both = account([first, second], {JOB: [ev("master_restarted", 102), ev("master_restarted", 105)]})
    assert len(both.recovered) == 2 and not both.missed
    one = account([first, second], {JOB: [ev("master_restarted", 102)]})
    assert len(one.recovered) == 1 and len(one.missed) == 1


def test_prime_master_killed_during_a_failover_each_fault_gets_its_own() -> None:
    worker = fault("worker_kill", 100, R[2], settled=112, planned="prime_master_in_failover")
    master = fault(
        "prime_master_kill", 101, "lm.prime-master", settled=112, planned="prime_master_in_failover"
    )
    events = [ev("failover_started", 100.5, R[2], "role"), ev("master_restarted", 103, None, "master")]
    report = check([worker, master], {JOB: events}, DONE)
    assert report.ok, report.problems()
    # the restarted PrimeMaster starting the same failover again is one recovery too many
    again = account([worker, master], {JOB: [*events, ev("failover_started", 104, R[2], "role")]})
    assert len(again.duplicated) == 1


def test_node_removal_is_one_recovery_of_the_node_or_its_actors() -> None:
    removal = Injected("node_removal", JOB, 100, node="n" * 56, node_actors=(R[2], R[3]), settled_at=130)
    by_actor = account([removal], {JOB: [ev("failover_started", 104, R[3], "role")]})
    by_node = account([removal], {JOB: [ev("node_relaunch", 104, None, "node", node="n" * 56)]})
    assert len(by_actor.recovered) == 1 and len(by_node.recovered) == 1
    per_rank = account(
        [removal], {JOB: [ev("failover_started", 104, R[2]), ev("failover_started", 109, R[3])]}
    )
    assert len(per_rank.duplicated) == 1
    elsewhere = account([removal], {JOB: [ev("failover_started", 104, R[0])]})
    assert len(elsewhere.mis_attributed) == 1


def test_another_jobs_recovery_is_spurious_not_mis_attributed() -> None:
    accounting = account(
        [fault("worker_kill", 100, R[1])],
        {JOB: [ev("failover_started", 101, R[1])], "pipe": [ev("failover_started", 102, "pipe.sink.0")]},
    )
    assert len(accounting.recovered) == 1 and [j for j, _ in accounting.spurious] == ["pipe"]


def test_loss_leaks_records_limits_and_a_failed_job_fail_the_campaign() -> None:
    failed = {JOB: JobStatus(name=JOB, stage=JobStage.STOPPED, exit_code=1, reason="boom\ntrace")}
    report = check(
        [],
        {JOB: []},
        failed,
        loss=LossCheck("2.100000", "2.100001"),
        leaks=["actor lm.trainer.1"],
        records=RecordCount(5, (0, 1, 1, 3, 4, 9)),
        limit=LimitCheck(
            "max_restart=2",
            R[1],
            1,
            "role trainer reached max_restart=2 restarting training in place; last: lm.trainer.0",
        ),
    )
    problems = report.problems()
    assert "JOB FAILED: lm exit code 1: boom" in problems
    assert "LOSS MISMATCH: final loss 2.100001 vs fault-free 2.100000" in problems
    assert "LEAK: actor lm.trainer.1" in problems
    assert "RECORDS: 1 lost, 1 duplicated, 1 unexpected of 5" in problems
    assert any(
        p.startswith("LIMIT: expected a failed stop naming max_restart=2 and lm.trainer.1") for p in problems
    )
    assert report.lines()[-1] == "FAIL"


def test_a_limit_stop_naming_limit_and_culprit_passes() -> None:
    assert LimitCheck(
        "max_restart=2", R[1], 1, f"role trainer reached max_restart=2; culprit: {R[1]} (restarted)"
    ).ok
    assert not LimitCheck("max_restart=2", R[1], 0, f"max_restart=2 {R[1]}").ok  # a success is no limit stop
    assert not LossCheck(None, None).ok


def test_fewer_injected_than_planned_fails() -> None:
    report = check(
        [fault("worker_kill", 100, R[1])], {JOB: [ev("failover_started", 101, R[1])]}, DONE, planned=3
    )
    assert report.problems() == ["only 1 of 3 planned faults were injected"]
