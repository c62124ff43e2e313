"""A job that runs for many health timeouts, on a real local Ray, with nothing injected.

The first wave's jobs lived a minute or two; its SubMaster beat only at start, so with a short
heartbeat timeout every healthy elastic job was "recovered" again and again until its restart
limit stopped it. Here the reference elastic job (plus a simple role that never beats and one
that does) runs for many multiples of short timeouts and must end with zero recoveries and the
loss of a run with the defaults.

The soak with the defaults' ratio (timeout / interval = 24) over 20 timeouts is marked `soak`
(excluded by default: `pytest -m soak` runs it); the default run keeps a shorter version.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from dlu_api.status import JobStatus

pytestmark = [pytest.mark.ray, pytest.mark.slow]

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE.parents[1] / "benchmarks"))  # the job and alarm kinds of benchmarks/soak.py

from soak import ALARMS, soak_spec  # noqa: E402

STEP_S = 0.1


def alarms(status: JobStatus) -> list[str]:
    return [f"{e.kind}: {e.actor or e.role}: {e.message}" for e in status.events if e.kind in ALARMS]


def run(spec: Any) -> JobStatus:
    from dlu_prime import launcher
    from dlu_prime.master.state import MAX_EVENTS

    launcher.submit_job(spec, str(HERE))
    final = launcher.wait_job(spec)
    stored = launcher.stored_status(spec.name, spec.state_store.name, spec.state_store.options)
    assert stored is not None
    assert len(stored.events) <= MAX_EVENTS
    return final


@pytest.fixture(scope="module")
def reference_loss(ray_session: Any, tmp_path_factory: pytest.TempPathFactory) -> Callable[[int], str]:
    """The final loss of an unpaced run with the default health settings (pacing changes no
    loss), per step count, computed when first asked for."""
    losses: dict[int, str] = {}

    def loss(steps: int) -> str:
        if steps not in losses:
            ckpt = tmp_path_factory.mktemp(f"reference-{steps}")
            status = run(soak_spec(f"soak-ref-{steps}", ckpt, steps, None, 0.0, nproc=1))
            assert status.exit_code == 0, status.reason
            losses[steps] = (ckpt / "final_loss.txt").read_text()
        return losses[steps]

    return loss


HEARTBEAT_TIMEOUT_S = 2.0
SHORT_STEPS = 150  # 15 s at 0.1 s a step: over 7 heartbeat timeouts of 2 s, 5 hang timeouts of 3 s
SOAK_STEPS = 1300  # 130 s: over 20 timeouts of 6 s (the defaults' ratio: 6 / 0.25 = 120 / 5)


@pytest.mark.timeout(420)
def test_short_timeouts_a_healthy_job_is_never_recovered(
    reference_loss: Callable[[int], str], tmp_path: Path
) -> None:
    health = {
        "heartbeat_interval_s": 0.5,
        "heartbeat_timeout_s": HEARTBEAT_TIMEOUT_S,
        "hang_timeout_s": 3.0,
        "monitor_interval_s": 0.2,
    }
    status = run(soak_spec("soak-short", tmp_path, SHORT_STEPS, health, STEP_S, nproc=1))
    assert status.exit_code == 0, status.reason
    assert alarms(status) == []
    assert all(r.restart_count == 0 and r.inplace_restart_count == 0 for r in status.roles)
    assert status.job_restart_count == 0 and status.master_restart_count == 0
    assert (tmp_path / "final_loss.txt").read_text() == reference_loss(SHORT_STEPS)
    # The job ended: no role still lists an actor as running.
    assert not [a.name for r in status.roles for a in r.actors if a.stage in ("RUNNING", "READY", "INIT")]


@pytest.mark.soak
@pytest.mark.timeout(900)
def test_soak_defaults_ratio_twenty_timeouts(reference_loss: Callable[[int], str], tmp_path: Path) -> None:
    health = {"heartbeat_interval_s": 0.25, "heartbeat_timeout_s": 6.0, "hang_timeout_s": 12.0}
    status = run(soak_spec("soak-ratio", tmp_path, SOAK_STEPS, health, STEP_S, nproc=1))
    assert status.exit_code == 0, status.reason
    assert alarms(status) == []
    assert (tmp_path / "final_loss.txt").read_text() == reference_loss(SOAK_STEPS)
