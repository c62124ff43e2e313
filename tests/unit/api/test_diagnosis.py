"""The root-cause summary of `dlu status`, from a timeline."""

from __future__ import annotations

from dlu_api.cli.render import status_text
from dlu_api.diagnosis import root_cause
from dlu_api.status import JobEvent, JobStage, JobStatus


def event(t: float, kind: str, message: str, **extra: object) -> JobEvent:
    return JobEvent.model_validate({"time": t, "kind": kind, "message": message, **extra})


TIMELINE = [
    event(1, "stage", "INIT -> READY"),
    event(
        2,
        "restarted",
        "actor process died; Ray reconstructed it",
        actor="j.train.1",
        node_id="abcdef0123456789",
    ),
    event(2.5, "died", "a later, unrelated report", actor="j.train.0"),
    event(3, "failover_started", "role failover of j.train.1", role="train", tier="role"),
    event(5.5, "failover_done", "role failover done", role="train", tier="role", duration_s=2.5),
    event(9, "master_restarted", "PrimeMaster reconstructed in stage RUNNING", tier="master"),
]


def test_the_first_failure_is_the_root_cause_and_recoveries_follow() -> None:
    cause = root_cause(TIMELINE)
    assert cause.first_failure is not None and cause.first_failure.actor == "j.train.1"
    assert [e.kind for e in cause.recoveries] == ["failover_done", "master_restarted"]
    lines = cause.lines()
    assert (
        lines[0]
        == "first failure: j.train.1 on node abcdef012345 (restarted): actor process died; Ray reconstructed it"
    )
    assert lines[1] == "  [role] failover_done (2.50s): train: role failover done"


def test_status_text_shows_counters_and_root_cause() -> None:
    status = JobStatus(name="j", stage=JobStage.RUNNING, master_restart_count=1, events=TIMELINE)
    text = status_text(status)
    assert "restarts: PrimeMaster restarts 1" in text
    assert "root cause:\n  first failure: j.train.1" in text


def test_a_clean_timeline_has_no_root_cause() -> None:
    assert root_cause([event(1, "stage", "INIT -> READY")]).lines() == []
    assert "root cause" not in status_text(JobStatus(name="j", stage=JobStage.RUNNING, events=[]))
