"""benchmarks/remote_log_poll.py on a small log: both parses agree on the latest status (the
script checks it) and every figure is printed."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

BENCHMARKS = str(Path(__file__).resolve().parents[3] / "benchmarks")
if BENCHMARKS not in sys.path:
    sys.path.insert(0, BENCHMARKS)

import remote_log_poll  # noqa: E402
from figures import parse  # noqa: E402

pytestmark = pytest.mark.timeout(60)


def test_a_small_log_prints_its_size_and_both_parse_times(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(sys, "argv", ["remote_log_poll.py", "--ranks", "2", "--hours", "0.2", "--runs", "1"])
    remote_log_poll.main()
    figures = {f.name: f for f in parse(capsys.readouterr().out)}
    assert sorted(figures) == [
        "remote_log_mb_2r_0.2h",
        "remote_parse_all_2r_0.2h",
        "remote_parse_latest_2r_0.2h",
    ]
    assert figures["remote_log_mb_2r_0.2h"].value > 0
