"""The benchmark convention: FIGURE lines parse back, and run_all tolerates a missing or failing
benchmark while still printing the table of the others."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

pytestmark = pytest.mark.timeout(60)

BENCHMARKS = Path(__file__).resolve().parents[3] / "benchmarks"


@pytest.fixture
def modules() -> Iterator[tuple[ModuleType, ModuleType]]:
    sys.path.insert(0, str(BENCHMARKS))
    try:
        yield importlib.import_module("figures"), importlib.import_module("run_all")
    finally:
        sys.path.remove(str(BENCHMARKS))


def test_figure_lines_round_trip_and_noise_is_skipped(
    modules: tuple[ModuleType, ModuleType], capsys: pytest.CaptureFixture[str]
) -> None:
    figures, _ = modules
    first = figures.figure("a", 0.5, "s", 1.0, label="thing A")
    second = figures.figure("b", 3, "ms")
    out = capsys.readouterr().out
    parsed = figures.parse("noise\n" + out + 'FIGURE {"broken": 1}\nFIGURE not json\n')
    assert parsed == [first, second]
    assert parsed[0].within is True and parsed[1].within is None
    assert figures.Figure("c", 2.0, "s", 1.0).within is False


def test_run_all_reports_missing_failing_and_measured(
    modules: tuple[ModuleType, ModuleType], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _, run_all = modules
    (tmp_path / "good.py").write_text(
        "from figures import figure\nprint('hello')\nfigure('good_s', 0.25, 's', 1.0, label='good one')\n"
    )
    (tmp_path / "over.py").write_text("from figures import figure\nfigure('over_s', 2, 's', 1.0)\n")
    (tmp_path / "bad.py").write_text("raise SystemExit('boom')\n")
    (tmp_path / "figures.py").write_text((BENCHMARKS / "figures.py").read_text())
    monkeypatch.setattr(run_all, "HERE", tmp_path)
    benches = [run_all.Bench(name) for name in ("good.py", "over.py", "bad.py", "absent.py")]
    benches.append(run_all.Bench("ray_one.py", quick_args=None, uses_ray=True))
    (tmp_path / "ray_one.py").write_text("raise SystemExit('must not run in quick mode')\n")
    outcomes = [run_all.run_one(bench, quick=True) for bench in benches]
    assert [o.status for o in outcomes] == ["ok", "ok", "failed", "missing", "skipped"]
    assert "boom" in outcomes[2].detail
    table = run_all.table(outcomes)
    assert "good one" in table and "within" in table and "OVER" in table
    assert "absent.py" in table and "missing" in table


def test_a_long_benchmark_runs_only_with_long(
    modules: tuple[ModuleType, ModuleType], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _, run_all = modules
    (tmp_path / "figures.py").write_text((BENCHMARKS / "figures.py").read_text())
    (tmp_path / "campaign.py").write_text("from figures import figure\nfigure('spurious', 0, '', 0)\n")
    monkeypatch.setattr(run_all, "HERE", tmp_path)
    bench = run_all.Bench("campaign.py", long=True)
    skipped = run_all.run_one(bench, quick=False)
    assert (skipped.status, skipped.figures) == ("skipped", [])
    assert "--long" in skipped.detail
    ran = run_all.run_one(bench, quick=False, long=True)
    assert ran.status == "ok" and [f.within for f in ran.figures] == [True]
    assert {b.script for b in run_all.BENCHMARKS if b.long} == {"chaos.py"}
