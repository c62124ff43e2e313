"""The deterministic simulation (dlu_prime.testing.sim): a seed replays exactly, and undoing a
fix of issue 27 makes it report the invariant that fix keeps."""

from __future__ import annotations

import importlib
import re
import sys
from pathlib import Path

import pytest

from dlu_api.vocabulary import InPlaceDecision, InPlaceVerdict
from dlu_prime.master import failover, lifecycle
from dlu_prime.master.core import failover_chain
from dlu_prime.master.state import JobState
from dlu_prime.testing.sim.runner import run_seed
from dlu_prime.testing.sim.scale import pass_times

BENCHMARKS = Path(__file__).resolve().parents[3] / "benchmarks"


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


def test_undoing_the_look_at_a_saved_failovers_replacements_is_found(monkeypatch: pytest.MonkeyPatch) -> None:
    """Seed 8553: a rebuilt PrimeMaster resumed a saved failover from its first step unlooked-at,
    absorbing the death of a replacement the dead one had placed."""
    monkeypatch.setattr(failover_chain, "resume_saved", failover_chain.resume)
    for seed in (8553, 11945):
        violation = run_seed(seed).violation
        assert violation is not None and violation.startswith("counted once")


def test_simulate_runs_the_seeds_from_first(capsys: pytest.CaptureFixture[str]) -> None:
    """`--first N --seeds K`: seeds N..N+K-1, so a long run goes in chunks."""
    sys.path.insert(0, str(BENCHMARKS))
    try:
        simulate = importlib.import_module("simulate")
    finally:
        sys.path.remove(str(BENCHMARKS))
    assert simulate.main(["--first", "8553", "--seeds", "2"]) == 0
    events = run_seed(8553).events + run_seed(8554).events
    assert capsys.readouterr().out.splitlines()[-1].startswith(f"seeds 2, events {events}, ")


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
