"""The deterministic simulation (dlu_prime.testing.sim): a seed replays exactly, and undoing a
fix of issue 27 makes it report the invariant that fix keeps."""

from __future__ import annotations

import re

import pytest

from dlu_api.vocabulary import InPlaceDecision, InPlaceVerdict
from dlu_prime.master import failover, lifecycle
from dlu_prime.master.state import JobState
from dlu_prime.testing.sim.runner import run_seed
from dlu_prime.testing.sim.scale import pass_times


def _masked(trace: list[str]) -> list[str]:
    """A run id is random (uuid4) and an outage's length in its message is the writer's real
    time; the rest of a trace (every decision) is the seed's."""
    return [
        re.sub(r"after \d+\.\ds", "after <s>", re.sub(r"run [0-9a-f]{8}", "run <id>", line)) for line in trace
    ]


def _first_violation(invariant: str, seeds: int) -> int | None:
    """The first seed whose run breaks `invariant` (None if none of `seeds` does)."""
    for seed in range(seeds):
        violation = run_seed(seed).violation
        if violation is not None and violation.startswith(invariant):
            return seed
    return None


def test_a_seed_replays_exactly() -> None:
    first, again = run_seed(11), run_seed(11)
    assert _masked(first.trace) == _masked(again.trace)
    assert (first.events, first.faults, first.decisions) == (again.events, again.faults, again.decisions)
    assert first.faults > 0 and first.events > 0


def test_undoing_causality_is_found(monkeypatch: pytest.MonkeyPatch) -> None:
    """Defect 2: every report joined the failover in flight, whatever it said."""
    real = failover.judge_inplace

    def joins_all(state: JobState, role: str, *args: object, **kwargs: object) -> InPlaceDecision:
        if failover._covering(state, role) is not None:  # pyright: ignore[reportPrivateUsage]
            return InPlaceDecision(InPlaceVerdict.JOIN, "joined (undone fix)")
        return real(state, role, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr("dlu_prime.master.core.requests.judge_inplace", joins_all)
    assert _first_violation("counted once", 400) is not None


def test_undoing_resume_numbering_is_found(monkeypatch: pytest.MonkeyPatch) -> None:
    """Defect 7: `dlu resume` copied the events but started their numbering again."""
    real = lifecycle.resumed_state

    def renumbers(spec: object, old: JobState) -> JobState:
        state = real(spec, old)  # type: ignore[arg-type]
        state.event_seq = 0
        return state

    monkeypatch.setattr("dlu_prime.master.construction.resumed_state", renumbers)
    assert _first_violation("events", 400) is not None


def test_a_monitoring_pass_at_scale_is_timed() -> None:
    times = pass_times(nodes=64, ranks=8, passes=12)
    assert len(times) == 12 and all(t > 0 for t in times)
    decided = pass_times(nodes=64, ranks=8, passes=12, cpu=True, decision=True)  # less its I/O
    assert len(decided) == 12 and all(t > 0 for t in decided)


@pytest.mark.timeout(1200)  # about a minute on two idle cores; far more on a loaded machine
def test_a_thousand_seeds_hold_every_invariant() -> None:
    """The default run's share of benchmarks/simulate.py: short jobs, every fault kind."""
    bad = [r for r in (run_seed(s, fault_steps=10, quiet_steps=25) for s in range(1000)) if r.violation]
    assert not bad, "\n".join([f"seed {bad[0].seed}: {bad[0].violation}", *bad[0].trace])
