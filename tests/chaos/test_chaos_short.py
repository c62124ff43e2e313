"""A short chaos campaign on a real local Ray: the reference elastic job (2 nodes x 2
processes, char-level LM, 0.1 s steps) with a simple role, hit at seeded times by a training
process crash (SIGKILL) and hang (SIGSTOP), an ElasticWorker kill, an ElasticMaster kill and a
PrimeMaster kill. Every fault must cause exactly one recovery event naming its culprit (none
mis-attributed, none spurious), the final loss must equal a fault-free run's, and nothing of
the job may be left. And a role run into max_restart stops naming the limit and the actor.

The long campaign (node removal, pipeline kills, overlapping PrimeMaster kills, 30 minutes) is
`benchmarks/chaos.py`; tests/chaos/test_chaos_cluster.py runs a few minutes of it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from chaos_check import LossCheck, check
from chaos_jobs import Training, steps_for
from chaos_run import TrainingCampaign, run_limit_case, run_reference
from chaos_schedule import FaultKind, injections, schedule

pytestmark = [pytest.mark.ray, pytest.mark.timeout(420)]

KINDS = [
    FaultKind.PROC_CRASH,
    FaultKind.PROC_HANG,
    FaultKind.WORKER_KILL,
    FaultKind.ELASTIC_MASTER_KILL,
    FaultKind.PRIME_MASTER_KILL,
]
DURATION_S = 50.0


def test_short_chaos_campaign_every_fault_recovered_once_same_loss_nothing_left(
    ray_session: Any, tmp_path: Path
) -> None:
    plan = schedule(1, DURATION_S, len(KINDS), KINDS, start_s=3.0, tail_s=2.0)
    steps = steps_for(DURATION_S, 0.1)
    expected = run_reference(Training("chaos-short-ref", steps, tmp_path / "ref", step_s=0.0))
    training = Training("chaos-short", steps, tmp_path / "run", step_s=0.1)

    outcome = TrainingCampaign(training).run(plan, finish_timeout_s=300.0)

    assert outcome.final is not None
    report = check(
        outcome.injected,
        {outcome.job: outcome.events},
        {outcome.job: outcome.final},
        planned=injections(plan),
        loss=LossCheck(expected, training.final_loss()),
        leaks=outcome.leaks,
        seed=1,
        notes=outcome.notes,
    )
    print("\n".join(report.lines()))
    assert report.ok, "\n".join(report.lines())


def test_role_over_max_restart_stops_naming_the_limit_and_the_killed_actor(
    ray_session: Any, tmp_path: Path
) -> None:
    training = Training("chaos-limit", 100_000, tmp_path, nnodes=2, nproc=1, max_restart=2, sidecar=False)
    limit, left = run_limit_case(training, kills=3)
    assert limit.ok, f"exit code {limit.exit_code}: {limit.reason}"
    assert left == []
