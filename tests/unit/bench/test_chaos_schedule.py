"""The chaos campaign's fault plan: a pure, reproducible function of the seed that covers every
asked-for kind, keeps its times in the window and its targets in range."""

from __future__ import annotations

import sys
from itertools import pairwise
from pathlib import Path

import pytest

BENCHMARKS = str(Path(__file__).resolve().parents[3] / "benchmarks")
if BENCHMARKS not in sys.path:
    sys.path.insert(0, BENCHMARKS)

from chaos_schedule import (  # noqa: E402
    PIPELINE_KINDS,
    TRAINING_KINDS,
    FaultKind,
    Shape,
    injections,
    parse_kinds,
    schedule,
)

pytestmark = pytest.mark.timeout(30)


def test_same_seed_same_plan_and_another_seed_another() -> None:
    first = schedule(1, 1800, 50, TRAINING_KINDS)
    assert first == schedule(1, 1800, 50, TRAINING_KINDS)
    assert first != schedule(2, 1800, 50, TRAINING_KINDS)
    assert schedule("1-pipeline", 200, 5, PIPELINE_KINDS) == schedule("1-pipeline", 200, 5, PIPELINE_KINDS)


def test_every_kind_is_planned_and_the_count_is_met() -> None:
    plan = schedule(7, 1800, 50, TRAINING_KINDS)
    assert {p.kind for p in plan} == set(TRAINING_KINDS)
    assert 50 <= injections(plan) <= 51  # an overlapping kind last may inject one more
    assert [p.kind for p in plan].count(FaultKind.ELASTIC_MASTER_NODE_CHECK) == 1


def test_times_are_ordered_spaced_and_in_the_window() -> None:
    plan = schedule(3, 600, 20, TRAINING_KINDS, start_s=10, tail_s=30)
    assert plan[0].kind is FaultKind.ELASTIC_MASTER_NODE_CHECK and plan[0].at == 0.0
    times = [p.at for p in plan[1:]]
    assert times == sorted(times)
    assert all(10 <= t <= 600 - 30 for t in times)
    slot = (600 - 30 - 10) / len(times)
    assert all(b - a >= slot / 2 - 1e-6 for a, b in pairwise(times))


def test_targets_are_in_range() -> None:
    shape = Shape(ranks=4, nodes=2, consumers=3)
    plan = schedule(11, 3000, 80, list(FaultKind), shape)
    for p in plan:
        if p.kind in (
            FaultKind.PROC_CRASH,
            FaultKind.PROC_HANG,
            FaultKind.WORKER_KILL,
            FaultKind.PRIME_MASTER_IN_FAILOVER,
        ):
            assert p.target is not None and 0 <= p.target < 4
        elif p.kind is FaultKind.NODE_REMOVAL:
            assert p.target is not None and 0 <= p.target < 2
        elif p.kind is FaultKind.CONSUMER_KILL:
            assert p.target is not None and 0 <= p.target < 3
        else:
            assert p.target is None
    assert {p.target for p in plan if p.kind is FaultKind.WORKER_KILL} <= {0, 1, 2, 3}


def test_fewer_faults_than_kinds_plans_a_subset() -> None:
    plan = schedule(
        5,
        300,
        3,
        [FaultKind.PROC_CRASH, FaultKind.WORKER_KILL, FaultKind.PROC_HANG, FaultKind.PRIME_MASTER_KILL],
    )
    assert injections(plan) == 3 and len({p.kind for p in plan}) == 3


def test_too_short_a_run_is_refused_with_the_fix() -> None:
    with pytest.raises(
        ValueError, match=r"duration: 50 faults in 90 s .* make the run longer or ask for fewer faults"
    ):
        schedule(1, 100, 50, [FaultKind.PROC_CRASH], start_s=10)
    with pytest.raises(ValueError, match="kinds: no fault kind"):
        schedule(1, 100, 5, [])
    with pytest.raises(ValueError, match="faults: 0 < 1"):
        schedule(1, 100, 0, [FaultKind.PROC_CRASH])


def test_kinds_parse_from_the_cli() -> None:
    assert parse_kinds("all") == tuple(FaultKind)
    assert parse_kinds("proc_crash, worker_kill,proc_crash") == (FaultKind.PROC_CRASH, FaultKind.WORKER_KILL)
    with pytest.raises(
        ValueError, match=r"--kinds: unknown fault kind 'nope'; use 'all' or some of: proc_crash"
    ):
        parse_kinds("proc_crash,nope")


def test_chaos_refuses_an_out_directory_a_former_run_left_files_in(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A former run's stop file and probe counter steered a new run (it killed an ElasticMaster
    that did not exist yet): a non-empty --out is refused before anything starts."""
    from chaos import parse_args

    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "stop-at-step").write_text("13320")
    with pytest.raises(SystemExit) as stopped:
        parse_args(["--minutes", "1", "--out", str(tmp_path)])
    assert stopped.value.code == 2
    assert f"--out {tmp_path} is not empty: give a new or empty directory" in capsys.readouterr().err
    assert parse_args(["--minutes", "1", "--out", str(tmp_path / "new")]).out == str(tmp_path / "new")
