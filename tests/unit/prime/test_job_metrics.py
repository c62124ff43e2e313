"""JobMetrics: what it records from a job state, failovers and node checks, through a fake
metrics backend; and that a backend that fails turns it into a quiet no-op, never an error."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field

import pytest

from dlu_api.spec import spec_from_dict
from dlu_api.status import JobStage
from dlu_prime.master import metrics as metrics_module
from dlu_prime.master.manager import new_state
from dlu_prime.master.metrics import JobMetrics
from dlu_prime.master.state import SUB_MASTER_RANK, ActorRecord, JobState

pytestmark = pytest.mark.timeout(10)


@dataclass
class FakeMetric:
    kind: str
    name: str
    tag_keys: tuple[str, ...]
    boundaries: tuple[float, ...] = ()
    records: list[tuple[float, dict[str, str]]] = field(default_factory=list[tuple[float, dict[str, str]]])

    def record(self, value: float, tags: dict[str, str]) -> None:
        assert set(tags) == set(self.tag_keys), (self.name, tags)
        self.records.append((value, dict(tags)))

    def last(self, **tags: str) -> float:
        return [v for v, t in self.records if all(t.get(k) == x for k, x in tags.items())][-1]

    def total(self, **tags: str) -> float:
        return sum(v for v, t in self.records if all(t.get(k) == x for k, x in tags.items()))


class FakeBackend:
    def __init__(self, fail_on: str | None = None) -> None:
        self.metrics: dict[str, FakeMetric] = {}
        self.fail_on = fail_on

    def _make(
        self, kind: str, name: str, tag_keys: Sequence[str], boundaries: Sequence[float] = ()
    ) -> FakeMetric:
        if self.fail_on == name:
            raise RuntimeError("metrics agent unavailable")
        metric = FakeMetric(kind, name, tuple(tag_keys), tuple(boundaries))
        self.metrics[name] = metric
        return metric

    def gauge(self, name: str, description: str, tag_keys: Sequence[str]) -> FakeMetric:
        return self._make("gauge", name, tag_keys)

    def counter(self, name: str, description: str, tag_keys: Sequence[str]) -> FakeMetric:
        return self._make("counter", name, tag_keys)

    def histogram(
        self, name: str, description: str, boundaries: Sequence[float], tag_keys: Sequence[str]
    ) -> FakeMetric:
        return self._make("histogram", name, tag_keys, boundaries)


def job_state() -> JobState:
    spec = spec_from_dict(
        {
            "name": "m",
            "device_type": "CPU",
            "device_per_node": 0,
            "roles": [
                {"name": "trainer", "entrypoint": "pkg.t:main", "total": 2},
                {"name": "reward", "entrypoint": "pkg.r:main", "total": 1},
            ],
        }
    )
    return new_state(spec)


@pytest.fixture(autouse=True)
def fresh_warning(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(metrics_module, "_warned", False)


def test_stage_restarts_and_heartbeat_age_per_role() -> None:
    backend = FakeBackend()
    metrics = JobMetrics("m", backend)
    state = job_state()
    state.stage = JobStage.RUNNING
    metrics.observe_state(state, {"m.trainer.0": 1.5, "m.trainer.1": 7.0, "m.reward.0": 0.2, "gone": 99.0})
    stage = backend.metrics["dlu_job_stage"]
    assert stage.last(stage="RUNNING") == 1.0 and stage.last(stage="INIT") == 0.0
    assert backend.metrics["dlu_job_stage_code"].last(dlu_job="m") == 3.0
    age = backend.metrics["dlu_heartbeat_age_seconds"]
    assert age.last(role="trainer") == 7.0 and age.last(role="reward") == 0.2
    assert backend.metrics["dlu_restarts_total"].records == []  # nothing restarted yet

    state.roles["trainer"].restart_count = 2
    state.master_restart_count = 1
    metrics.observe_state(state, {})
    metrics.observe_state(state, {})  # no change: counters must not double count
    state.roles["trainer"].restart_count = 3
    metrics.observe_state(state, {})
    restarts = backend.metrics["dlu_restarts_total"]
    assert restarts.total(tier="role") == 3 and restarts.total(tier="master") == 1
    assert restarts.total(tier="job") == 0
    assert backend.metrics["dlu_role_restarts_total"].total(role="trainer") == 3
    assert all(tags["dlu_job"] == "m" for m in backend.metrics.values() for _, tags in m.records)


def test_failover_histogram_and_node_scores() -> None:
    backend = FakeBackend()
    metrics = JobMetrics("m", backend)
    metrics.failover_done("in-place", 0.8)
    metrics.failover_done("role", 3.1)
    hist = backend.metrics["dlu_failover_duration_seconds"]
    assert hist.kind == "histogram" and 1.5 in hist.boundaries and 4.0 in hist.boundaries
    assert [(v, t["tier"]) for v, t in hist.records] == [(0.8, "in-place"), (3.1, "role")]
    metrics.node_check_scores({"node-a": 1.0, "node-b": 5.2})
    scores = backend.metrics["dlu_node_check_score_seconds"]
    assert scores.last(node="node-b") == 5.2


def test_a_backend_that_cannot_create_metrics_makes_a_quiet_no_op(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger=metrics_module.__name__)
    first = JobMetrics("m", FakeBackend(fail_on="dlu_restarts_total"))
    second = JobMetrics("n", FakeBackend(fail_on="dlu_job_stage"))
    for metrics in (first, second):
        assert not metrics.enabled
        metrics.observe_state(job_state(), {"m.trainer.0": 1.0})
        metrics.failover_done("role", 1.0)
        metrics.node_check_scores({"a": 1.0})
    warnings = [r for r in caplog.records if "metrics" in r.getMessage()]
    assert len(warnings) == 1 and "metrics agent unavailable" in warnings[0].getMessage()


def test_a_failing_recording_turns_metrics_off_without_raising(caplog: pytest.LogCaptureFixture) -> None:
    backend = FakeBackend()
    metrics = JobMetrics("m", backend)

    def broken(value: float, tags: dict[str, str]) -> None:
        raise ValueError("bad tag")

    backend.metrics["dlu_failover_duration_seconds"].record = broken  # type: ignore[method-assign]
    metrics.failover_done("role", 1.0)
    assert not metrics.enabled
    metrics.failover_done("role", 1.0)  # silent now
    assert sum("bad tag" in r.getMessage() for r in caplog.records) == 1


def test_a_role_heartbeat_age_is_its_ranks_never_its_sub_master() -> None:
    """An elastic role's SubMaster beats rarely; its age would hide the ranks' (issue: the age
    grew without bound while every rank beat)."""
    backend = FakeBackend()
    metrics = JobMetrics("m", backend)
    state = job_state()
    state.actors["m.trainer.submaster"] = ActorRecord(
        name="m.trainer.submaster", role="trainer", rank=SUB_MASTER_RANK
    )
    metrics.observe_state(state, {"m.trainer.submaster": 600.0, "m.trainer.0": 0.4, "m.trainer.1": 0.9})
    assert backend.metrics["dlu_heartbeat_age_seconds"].last(role="trainer") == 0.9


def test_node_scores_are_set_again_on_refresh_and_replaced_by_a_new_check() -> None:
    """Ray exports a gauge only while it is set: a score set once vanished from the endpoint."""
    backend = FakeBackend()
    metrics = JobMetrics("m", backend)
    metrics.refresh()  # nothing checked yet: nothing to set
    scores = backend.metrics["dlu_node_check_score_seconds"]
    assert scores.records == []
    metrics.node_check_scores({"node-a": 1.0, "node-b": 5.2})
    metrics.refresh()
    metrics.refresh()
    assert [t["node"] for _, t in scores.records].count("node-b") == 3
    metrics.node_check_scores({"node-a": 0.7})
    scores.records.clear()
    metrics.refresh()
    assert scores.records == [(0.7, {"dlu_job": "m", "node": "node-a"})]


def test_recovery_durations_reach_the_histogram_for_node_relaunches_too() -> None:
    """The hook times what the PrimeManager runs: failovers at their end, node relaunches."""
    from dlu_api.status import JobEvent
    from dlu_api.vocabulary import Tier
    from dlu_prime.master.changes import FailoverEnded, NodesRelaunched, StageChanged
    from dlu_prime.master.hooks import failover_metrics
    from dlu_prime.master.state import FailoverRecord

    class Manager:
        def __init__(self) -> None:
            self.metrics = JobMetrics("m", FakeBackend())

    manager = Manager()
    timed = JobEvent(time=0.0, kind="x", message="", duration_s=2.5)
    failover_metrics(manager, NodesRelaunched(["n1"], ["n2"], 2.5), [timed])  # type: ignore[arg-type]
    record = FailoverRecord(tier=Tier.JOB, role=None, actors=["m.trainer.0"], reason="r", started_at=0.0)
    failover_metrics(manager, FailoverEnded(record, None), [timed])  # type: ignore[arg-type]
    failover_metrics(manager, FailoverEnded(record, "failed"), [timed])  # type: ignore[arg-type]
    failover_metrics(manager, StageChanged(JobStage.RUNNING), [timed])  # type: ignore[arg-type]
    backend = manager.metrics._failover  # pyright: ignore[reportPrivateUsage]
    assert [(v, t["tier"]) for v, t in backend.records] == [(2.5, "node"), (2.5, "job")]  # type: ignore[attr-defined]


def test_the_world_size_of_an_elastic_role_follows_its_ranks() -> None:
    spec = spec_from_dict(
        {
            "name": "j",
            "device_type": "CPU",
            "device_per_node": 0,
            "roles": [
                {
                    "name": "t",
                    "kind": "elastic",
                    "entrypoint": "train.py",
                    "elastic": {"nnodes": "1:2", "nproc_per_node": 2},
                }
            ],
        }
    )
    state = new_state(spec)
    backend = FakeBackend()
    metrics = JobMetrics("j", backend)
    metrics.observe_state(state, {})
    assert backend.metrics["dlu_world_size"].last(dlu_job="j", role="t") == 4.0
    for name in ("j.t.2", "j.t.3"):  # one node lost: the role shrank
        del state.actors[name]
    metrics.observe_state(state, {})
    assert backend.metrics["dlu_world_size"].last(dlu_job="j", role="t") == 2.0


def test_lost_steps_add_up_per_role() -> None:
    backend = FakeBackend()
    metrics = JobMetrics("m", backend)
    metrics.lost_steps("trainer", 1)
    metrics.lost_steps("trainer", 3)
    lost = backend.metrics["dlu_checkpoint_lost_steps_total"]
    assert lost.kind == "counter" and lost.total(role="trainer", dlu_job="m") == 4.0


def test_one_job_level_restart_is_one_restart_in_the_tier_series() -> None:
    """`dlu_restarts_total` summed over `tier` is the job's restarts: a job-level restart, which
    also spends the global budget, counts once (as `job`), never again as a `global` tier."""
    from dlu_api.vocabulary import Tier
    from dlu_prime.master.tiers import charge

    backend = FakeBackend()
    metrics = JobMetrics("m", backend)
    state = job_state()
    charge(state, Tier.JOB)
    charge(state, Tier.ROLE, "trainer")
    metrics.observe_state(state, {})
    restarts = backend.metrics["dlu_restarts_total"]
    assert restarts.total(tier="job") == 1 and restarts.total(tier="role") == 1
    assert sum(value for value, _ in restarts.records) == 2
    assert "global" not in {tags["tier"] for _, tags in restarts.records}
