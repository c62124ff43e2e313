"""A short chaos campaign on a real local Ray: the reference elastic job (2 nodes x 2
processes, char-level LM, 0.1 s steps) with a simple role, hit at seeded times by a training
process crash (SIGKILL) and hang (SIGSTOP), an ElasticWorker kill, an ElasticMaster kill and a
PrimeMaster kill. Every fault must cause exactly one recovery event naming its culprit (none
mis-attributed, none spurious), the final loss must equal the fault-free loss of the same
training, and nothing of the job may be left.

The long campaign (node removal, pipeline kills, overlapping PrimeMaster kills, the node check,
a limit stop; 30 minutes) is `benchmarks/chaos.py`; test_chaos_soak.py runs a few minutes of it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import chaos_reference
import pytest
from chaos_check import LossCheck, check
from chaos_jobs import Training, steps_for
from chaos_run import TrainingCampaign
from chaos_schedule import FaultKind, injections, schedule

pytestmark = [pytest.mark.ray, pytest.mark.slow, pytest.mark.timeout(600)]

KINDS = [
    FaultKind.PROC_CRASH,
    FaultKind.PROC_HANG,
    FaultKind.WORKER_KILL,
    FaultKind.ELASTIC_MASTER_KILL,
    FaultKind.PRIME_MASTER_KILL,
]
DURATION_S = 30.0


def test_short_chaos_campaign_every_fault_recovered_once_same_loss_nothing_left(
    ray_session: Any, tmp_path: Path
) -> None:
    plan = schedule(1, DURATION_S, len(KINDS), KINDS, start_s=3.0, tail_s=2.0)
    steps = 4 * steps_for(DURATION_S, 0.1)  # at most; it ends 50 steps after the last fault's recovery
    training = Training("chaos-short", steps, tmp_path, step_s=0.1, open_ended=True)
    losses = tmp_path / "reference-losses.txt"
    reference = chaos_reference.start(steps, training.ranks, losses=losses)  # computed alongside
    try:
        outcome = TrainingCampaign(training, recovery_timeout_s=90.0).run(plan, finish_timeout_s=300.0)
        assert outcome.last_step is not None, outcome.notes
        expected = chaos_reference.loss_at(reference, losses, outcome.last_step, timeout_s=300.0)
    finally:
        if reference.poll() is None:
            reference.kill()
            reference.communicate()

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
