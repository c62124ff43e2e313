"""The zygote's preload runs its imports with the cyclic collector off, freezes what they made
before the collector is on again, and gives it back."""

from __future__ import annotations

import gc
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from dlu_prime.zygote_server import _preload

RECORDER = """
import gc
import sys
sys.modules[__name__].collecting = gc.isenabled()
"""


@pytest.fixture
def modules(tmp_path: Path) -> Iterator[Path]:
    sys.path.insert(0, str(tmp_path))
    try:
        yield tmp_path
    finally:
        gc.unfreeze()  # what `_preload` froze of this test process
        sys.path.remove(str(tmp_path))
        for name in [n for n in sys.modules if n.startswith("dlu_preload_probe")]:
            del sys.modules[name]


def test_imports_run_without_the_collector_which_is_on_again_after(modules: Path) -> None:
    (modules / "dlu_preload_probe_a.py").write_text(RECORDER)
    (modules / "dlu_preload_probe_b.py").write_text("raise RuntimeError('broken on purpose')\n")
    (modules / "dlu_preload_probe_c.py").write_text(RECORDER)
    assert gc.isenabled()
    loaded, failed = _preload(["dlu_preload_probe_a", "dlu_preload_probe_b", "dlu_preload_probe_c"])
    assert loaded == ["dlu_preload_probe_a", "dlu_preload_probe_c"]
    assert set(failed) == {"dlu_preload_probe_b"}
    assert sys.modules["dlu_preload_probe_a"].collecting is False
    assert sys.modules["dlu_preload_probe_c"].collecting is False  # still off after a failure
    assert gc.isenabled()


def test_what_the_imports_made_is_out_of_the_collectors_reach_when_it_is_on_again(modules: Path) -> None:
    # Left in generation 0, the first allocation after the preload would start a collection
    # walking every object the imports made (0.2 s after torch's).
    (modules / "dlu_preload_probe_f.py").write_text("made = [[] for _ in range(50_000)]\n")
    _preload(["dlu_preload_probe_f"])
    made = sys.modules["dlu_preload_probe_f"].made
    tracked = {id(thing) for thing in gc.get_objects()}  # the frozen are in no generation
    assert id(made) not in tracked
    assert not any(id(item) in tracked for item in made[:100])
    assert gc.get_freeze_count() >= 50_000


def test_a_collector_that_was_off_stays_off(modules: Path) -> None:
    (modules / "dlu_preload_probe_d.py").write_text(RECORDER)
    gc.disable()
    try:
        _preload(["dlu_preload_probe_d"])
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_an_interrupted_preload_gives_the_collector_back(modules: Path) -> None:
    (modules / "dlu_preload_probe_e.py").write_text("raise KeyboardInterrupt\n")
    with pytest.raises(KeyboardInterrupt):
        _preload(["dlu_preload_probe_e"])
    assert gc.isenabled()
