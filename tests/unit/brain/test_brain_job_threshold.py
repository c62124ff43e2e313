"""A job's `autoscale.marginal_threshold` reaches the Brain: from the spec into the registration,
over HTTP into the database, and into the plans of that job only. A job that sends none is sized
with the Brain's own setting; an older Brain that refuses the field still takes the job."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pydantic import create_model
from typer.testing import CliRunner

import dlu_brain.server
from dlu_api.cli import app
from dlu_api.spec import spec_from_dict
from dlu_brain import AdminSettings, Brain, BrainDatabase, BrainServer, OptimizerSettings
from dlu_prime.brain_port import (
    BrainClient,
    BrainMode,
    JobRegistration,
    PlanOutcome,
    RolePlan,
    RoleShape,
    StatSample,
    registration_from_spec,
)
from dlu_prime.brain_port.models import WireModel

pytestmark = pytest.mark.timeout(90)
COMM = {n: 100.0 / (1.0 / n + 0.02 * n) for n in range(1, 9)}  # 2 -> 3 keeps 75% of linear, 3 -> 4 58%


def job(name: str, threshold: float | None) -> JobRegistration:
    shape = RoleShape(kind="elastic", size=2, min_size=1, max_size=8, elastic=True)
    return JobRegistration(name=name, run_id="r1", roles={"trainer": shape}, entrypoint="train:main",
                           config_hash="c", marginal_threshold=threshold)  # fmt: skip


@pytest.fixture
def server(tmp_path: Path) -> Iterator[BrainServer]:
    brain = Brain(
        BrainDatabase(f"sqlite:///{tmp_path / 'brain.sqlite'}"),
        AdminSettings(min_samples=3),
        OptimizerSettings(linear_threshold=0.5),
    )
    made = BrainServer(brain)
    made.serve_in_thread()
    try:
        yield made
    finally:
        made.shutdown()
        made.server_close()
        brain.db.close()


def run_sizes(client: BrainClient, sizes: list[int]) -> RolePlan:
    """The job runs each size (the COMM curve), applying each plan the Brain sends; the last plan."""
    seq = 0
    plan: RolePlan | None = None
    for size in sizes:
        sample = StatSample(time=float(seq), kind="throughput", role="trainer", world_size=size,
                            samples_per_s=COMM[size])  # fmt: skip
        client.report([sample.model_copy(update={"time": float(seq + i)}) for i in range(3)])
        seq += 3
        answer = client.plan()
        assert answer is not None and client.mode is BrainMode.CLUSTER
        (plan,) = answer.roles
        if size != sizes[-1]:
            assert plan.size == size + 1 and plan.id is not None, plan.reason
            client.plan_outcome(PlanOutcome(run_id="r1", plan_id=plan.id, state="applied"))
    assert plan is not None
    return plan


def test_the_spec_threshold_is_in_the_registration() -> None:
    roles = [{"name": "trainer", "kind": "elastic", "entrypoint": "m:train", "resizable": True,
              "elastic": {"nnodes": "1:4"}}]  # fmt: skip
    data: dict[str, Any] = {"name": "job", "device_type": "CPU", "device_per_node": 0, "roles": roles}
    spec = spec_from_dict({**data, "autoscale": {"mode": "cluster", "marginal_threshold": 0.7}})
    assert registration_from_spec(spec, "r1").marginal_threshold == 0.7
    default = registration_from_spec(spec_from_dict(data), "r1")
    assert default.marginal_threshold == spec_from_dict(data).autoscale.marginal_threshold == 0.3
    # the threshold is not part of the signature: runs with other thresholds share their history
    assert registration_from_spec(spec, "r1").signature == default.signature


def test_two_jobs_over_http_are_planned_with_their_own_thresholds(server: BrainServer) -> None:
    plans: dict[str, RolePlan] = {}
    for name, threshold in (("strict", 0.7), ("eager", 0.3), ("older", None)):
        client = BrainClient(server.url, retry_min_s=0.01, retry_max_s=0.05)
        try:
            client.job_started(job(name, threshold))
            plans[name] = run_sizes(client, [2, 3, 4])
        finally:
            client.close()
        row = server.brain.db.find_job(name, "r1")
        assert row is not None and row.marginal_threshold == threshold
    assert {n: p.size for n, p in plans.items()} == {"strict": 3, "eager": 5, "older": 5}
    assert "58% of linear (< 70%)" in plans["strict"].reason
    result = CliRunner().invoke(app, ["brain", "status", "--brain", server.url])
    assert result.exit_code == 0, result.output
    assert "strict run r1: sizes" in result.output and "threshold 70% of linear" in result.output
    assert 'older run r1: sizes {"trainer": 4}, threshold 50% of linear' in result.output  # the Brain's


def test_a_job_without_a_threshold_sends_what_an_older_job_sent() -> None:
    body = job("lm", None).model_dump(mode="json", exclude_none=True)
    assert set(body) == {"name", "run_id", "roles", "entrypoint", "config_hash"}


def _older_brains_registration() -> type[WireModel]:
    """JobRegistration as a Brain from before the threshold validates it (extras forbidden)."""
    fields: dict[str, Any] = {
        k: (f.annotation, f) for k, f in JobRegistration.model_fields.items() if k != "marginal_threshold"
    }
    return create_model("JobRegistration", __base__=WireModel, **fields)


def test_an_older_brain_that_refuses_the_threshold_still_takes_the_job(
    server: BrainServer, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    older = _older_brains_registration()

    class OlderBrainsCheck:
        @staticmethod
        def model_validate(body: Any) -> JobRegistration:
            older.model_validate(body)  # raises pydantic's extra_forbidden, answered 400
            return JobRegistration.model_validate(body)

    monkeypatch.setattr(dlu_brain.server, "JobRegistration", OlderBrainsCheck)
    caplog.set_level(logging.WARNING, logger="dlu_prime.brain_port.client")
    client = BrainClient(server.url, retry_min_s=0.01, retry_max_s=0.05)
    try:
        client.job_started(job("lm", 0.7))
        assert client.mode is BrainMode.CLUSTER
        plan = run_sizes(client, [2, 3, 4])
    finally:
        client.close()
    assert plan.size == 5  # the older Brain's own 50%: 58% of linear is enough
    row = server.brain.db.find_job("lm", "r1")
    assert row is not None and row.marginal_threshold is None
    (warning,) = [r.getMessage() for r in caplog.records]
    assert "takes no marginal_threshold" in warning and "not the spec's 0.7" in warning
