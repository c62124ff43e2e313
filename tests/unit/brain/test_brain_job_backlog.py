"""A job's `autoscale.backlog_target_s` reaches the Brain: from the spec into the registration (of
a job with backlog roles), over HTTP into the database, and into the backlog plans of that job
only. A job that sends none is sized with the Brain's own target; a Brain older than the field
(or older than the threshold too) still takes the job, without what it does not know."""

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
    RolePlan,
    RoleShape,
    StatSample,
    registration_from_spec,
)
from dlu_prime.brain_port.models import WireModel

pytestmark = pytest.mark.timeout(90)
BACKLOG = 300  # items waiting; one prep actor drains 2 items/s


def job(name: str, target_s: float | None, threshold: float | None = None) -> JobRegistration:
    prep = RoleShape(kind="simple", size=1, min_size=1, max_size=32)
    return JobRegistration(name=name, run_id="r1", roles={"prep": prep}, entrypoint="prep:main",
                           config_hash="c", marginal_threshold=threshold,
                           backlog_target_s=target_s)  # fmt: skip


def backlog_and_speeds() -> list[StatSample]:
    """What the job reports: the channel's backlog (drained by prep) and prep's speed at one
    actor, three times (measured: the Brain plans). Numbered as a reporter numbers them."""
    waiting = StatSample(seq=1, time=0.0, kind="backlog", channel="samples", role="prep", backlog=BACKLOG)
    speeds = [StatSample(seq=2 + i, time=1.0 + i, kind="throughput", role="prep", world_size=1,
                         steps_per_s=2.0) for i in range(3)]  # fmt: skip
    return [waiting, *speeds]


@pytest.fixture
def server(tmp_path: Path) -> Iterator[BrainServer]:
    brain = Brain(BrainDatabase(f"sqlite:///{tmp_path / 'brain.sqlite'}"), AdminSettings(min_samples=3))
    made = BrainServer(brain)
    made.serve_in_thread()
    try:
        yield made
    finally:
        made.shutdown()
        made.server_close()
        brain.db.close()


def planned(client: BrainClient, registration: JobRegistration) -> RolePlan:
    client.job_started(registration)
    client.report(backlog_and_speeds())
    answer = client.plan()
    assert answer is not None and client.mode is BrainMode.CLUSTER
    (plan,) = answer.roles
    return plan


def spec_data(**autoscale: Any) -> dict[str, Any]:
    roles = [
        {"name": "trainer", "kind": "elastic", "entrypoint": "m:train", "resizable": True,
         "elastic": {"nnodes": "1:4"}},
        {"name": "prep", "entrypoint": "m:prep", "resizable": True, "max_total": 8, "is_driver": False},
    ]  # fmt: skip
    data: dict[str, Any] = {"name": "job", "device_type": "CPU", "device_per_node": 0, "roles": roles}
    return {**data, "autoscale": {"mode": "cluster", **autoscale}} if autoscale else data


def test_the_spec_target_is_in_the_registration_of_a_job_with_backlog_roles() -> None:
    spec = spec_from_dict(spec_data(backlog_roles={"prep": "samples"}, backlog_target_s=5))
    sent = registration_from_spec(spec, "r1")
    assert sent.backlog_target_s == 5.0
    default = registration_from_spec(spec_from_dict(spec_data(backlog_roles={"prep": "samples"})), "r1")
    assert default.backlog_target_s == 30.0  # the spec's default, sent all the same
    # no backlog roles: nothing for the Brain to size with it, so it is not sent
    assert (
        registration_from_spec(spec_from_dict(spec_data(backlog_target_s=5)), "r1").backlog_target_s is None
    )
    # not part of the signature: runs with other targets share their history
    assert sent.signature == default.signature


def test_a_short_target_gets_more_actors_than_a_long_one_for_the_same_backlog(server: BrainServer) -> None:
    plans: dict[str, RolePlan] = {}
    for name, target in (("short", 5.0), ("long", 60.0), ("older", None)):
        client = BrainClient(server.url, retry_min_s=0.01, retry_max_s=0.05)
        try:
            plans[name] = planned(client, job(name, target))
        finally:
            client.close()
        row = server.brain.db.find_job(name, "r1")
        assert row is not None and row.backlog_target_s == target
    # 300 waiting at 2/s per actor: 30 actors drain it in 5 s, 3 in 60 s, 5 in the Brain's own 30 s
    assert {n: (p.size, p.algorithm) for n, p in plans.items()} == {
        "short": (30, "backlog_sizing"),
        "long": (3, "backlog_sizing"),
        "older": (5, "backlog_sizing"),
    }
    assert "needs 30 for 5 s" in plans["short"].reason and "needs 3 for 60 s" in plans["long"].reason
    result = CliRunner().invoke(app, ["brain", "status", "--brain", server.url])
    assert result.exit_code == 0, result.output
    assert "short run r1: sizes" in result.output and "backlog target 5 s" in result.output
    assert "older run r1" in result.output and "backlog target 30 s" in result.output  # the Brain's


def test_a_restarted_brain_keeps_the_jobs_target(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'brain.sqlite'}"
    first = Brain(BrainDatabase(url), AdminSettings(min_samples=3))
    first.start_job(job("lm", 5.0))
    first.add_samples("lm", "r1", backlog_and_speeds()[:3])  # two speeds: not measured yet
    assert first.plan("lm", "r1").roles == []
    first.db.close()
    again = Brain(BrainDatabase(url), AdminSettings(min_samples=3), OptimizerSettings(backlog_target_s=60.0))
    assert again.resume() == 1
    again.add_samples("lm", "r1", backlog_and_speeds()[3:])  # the third: measured
    (plan,) = again.plan("lm", "r1").roles
    assert plan.size == 30 and "for 5 s" in plan.reason  # the job's 5 s, not this Brain's 60
    again.db.close()


def _older_brains_registration(*unknown: str) -> type[WireModel]:
    """JobRegistration as a Brain from before `unknown` validates it (extras forbidden)."""
    fields: dict[str, Any] = {
        k: (f.annotation, f) for k, f in JobRegistration.model_fields.items() if k not in unknown
    }
    return create_model("JobRegistration", __base__=WireModel, **fields)


@pytest.mark.parametrize(
    ("unknown", "stored_threshold"),
    [(("backlog_target_s",), 0.7), (("marginal_threshold", "backlog_target_s"), None)],
    ids=["knows-the-threshold", "knows-neither"],
)
def test_an_older_brain_that_refuses_the_target_still_takes_the_job(
    server: BrainServer,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    unknown: tuple[str, ...],
    stored_threshold: float | None,
) -> None:
    older = _older_brains_registration(*unknown)
    refusals: list[str] = []

    class OlderBrainsCheck:
        @staticmethod
        def model_validate(body: Any) -> JobRegistration:
            try:
                older.model_validate(body)  # raises pydantic's extra_forbidden, answered 400
            except Exception as exc:
                refusals.append(str(exc))
                raise
            return JobRegistration.model_validate(body)

    monkeypatch.setattr(dlu_brain.server, "JobRegistration", OlderBrainsCheck)
    caplog.set_level(logging.WARNING, logger="dlu_prime.brain_port.client")
    client = BrainClient(server.url, retry_min_s=0.01, retry_max_s=0.05)
    try:
        plan = planned(client, job("lm", 5.0, threshold=0.7))
        assert client.mode is BrainMode.CLUSTER
    finally:
        client.close()
    assert plan.size == 5  # the older Brain's own 30 s
    row = server.brain.db.find_job("lm", "r1")
    assert row is not None and row.backlog_target_s is None and row.marginal_threshold == stored_threshold
    assert refusals and all("Extra inputs are not permitted" in r for r in refusals)
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == len(unknown)
    assert any("takes no backlog_target_s" in w and "not the spec's 5" in w for w in warnings)


def test_the_jobs_own_drain_rate_sizes_the_backlog_over_its_steps(tmp_path: Path) -> None:
    """A job that measured what one actor drains while it has work sends it with the backlog: the
    Brain sizes by it (a step may take several items, and steps/s counts the idle time too). A
    backlog sample without it (an older job) is sized by the role's steps/s per actor, as above."""
    brain = Brain(BrainDatabase(f"sqlite:///{tmp_path / 'brain.sqlite'}"), AdminSettings(min_samples=3))
    brain.start_job(job("lm", 5.0))
    waiting, *speeds = backlog_and_speeds()  # 2 steps/s per actor
    brain.add_samples("lm", "r1", [waiting.model_copy(update={"samples_per_s": 6.0}), *speeds])
    (plan,) = brain.plan("lm", "r1").roles
    assert plan.size == 10 and "at 6.0/s per actor needs 10 for 5 s" in plan.reason  # 300 / (6 x 5)
    brain.db.close()
