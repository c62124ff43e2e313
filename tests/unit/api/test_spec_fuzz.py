"""The seeded spec fuzzer of benchmarks/spec_fuzz.py, short: hostile files never crash the reader.

Each generated file (the reader's own attacks first, then files from the JSON Schema with hostile
values) is accepted or refused with a `SpecError` whose text prints, never another exception, in
bounded memory. Times are only bounded generously (a hang would show); benchmarks/spec_fuzz.py
reports them.
"""

from __future__ import annotations

import sys
import time
import tracemalloc
from pathlib import Path

import pytest

from dlu_api.cli.spec_commands import check_file

BENCHMARKS = str(Path(__file__).resolve().parents[3] / "benchmarks")
if BENCHMARKS not in sys.path:
    sys.path.insert(0, BENCHMARKS)

import spec_fuzz  # noqa: E402  (benchmarks/ is not a package)

pytestmark = pytest.mark.timeout(120)

SEED = 28
FILES = 160
BIG = 3 * 1024 * 1024  # past the 1 MiB limit, small enough to write quickly


def test_generated_hostile_specs_are_refused_cleanly_in_bounded_memory(tmp_path: Path) -> None:
    cases = list(spec_fuzz.generate(SEED, FILES, big=BIG))
    assert len(cases) == FILES
    again = list(spec_fuzz.generate(SEED, FILES, big=BIG))
    assert [c.content for c in cases] == [c.content for c in again]  # seeded: the same files
    verdicts: dict[str, str] = {}
    for index, case in enumerate(cases):
        path = tmp_path / f"{index:04d}{case.suffix}"
        path.write_bytes(case.content)
        tracemalloc.start()
        started = time.monotonic()
        try:
            verdict, detail = spec_fuzz.validate_once(path, check_file)
            peak_mb = tracemalloc.get_traced_memory()[1] / 1e6
        finally:
            tracemalloc.stop()
        elapsed = time.monotonic() - started
        assert verdict != "traceback", f"{case.name}: {detail}"
        assert elapsed < 30, f"{case.name} took {elapsed:.1f} s"  # a hang, not a speed check
        assert peak_mb < 64, f"{case.name} peaked at {peak_mb:.0f} MB"
        verdicts[case.name] = verdict
    hostile = [c.name for c in spec_fuzz.hostile(BIG)]
    accepted = [name for name in hostile if verdicts[name] != "refused"]
    # every attack and accepted-but-wrong value of issue 28 is refused; `nnodes: 1:3` is read as
    # the range it means (YAML 1.2), so that spec is fine
    assert accepted == ["sexagesimal-nnodes"]
    assert sum(v == "refused" for v in verdicts.values()) > len(hostile)  # schema files reach rules
