"""tests/timeouts.py in a pytest of its own: a test past its timeout fails alone and the run goes
on; a test that holds SIGALRM off is ended by the backstop, which ends the run."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

CONFTEST = 'import timeouts\ntimeouts.BACKSTOP_S = 1.0\npytest_plugins = ("timeouts",)\n'
TESTS = """
import signal, time
import pytest

@pytest.mark.timeout(1)
def test_a_slow_one():
    time.sleep(30)

def test_the_next_one():
    pass

@pytest.mark.timeout(1)
def test_held_off():
    signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGALRM])  # as a blocking Ray call does
    time.sleep(30)

def test_never_reached():
    pass
"""


def run_pytest(directory: Path, *args: str) -> subprocess.CompletedProcess[str]:
    (directory / "conftest.py").write_text(CONFTEST)
    (directory / "test_probe.py").write_text(TESTS)
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-o", "timeout_method=signal",
         "-v", "-rA", "test_probe.py", *args],
        cwd=directory, env={"PYTHONPATH": str(ROOT / "tests"), "PATH": "/usr/bin:/bin"},
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip


def test_a_test_past_its_timeout_fails_alone(tmp_path: Path) -> None:
    done = run_pytest(tmp_path, "-k", "not held_off and not never_reached")
    failed = "FAILED test_probe.py::test_a_slow_one - Failed: Timeout (>1.0s)"
    assert failed in done.stdout, done.stdout[-3000:]
    assert "PASSED test_probe.py::test_the_next_one" in done.stdout, done.stdout[-3000:]
    assert done.returncode == 1


def test_a_test_that_holds_the_signal_off_ends_the_run(tmp_path: Path) -> None:
    done = run_pytest(tmp_path, "-k", "held_off or never_reached")
    output = done.stdout + done.stderr
    assert "Timeout" in output and "test_held_off" in output, output[-3000:]
    assert "test_never_reached" not in done.stdout.split("test_held_off", 1)[1], output[-3000:]
    assert "short test summary info" not in done.stdout  # ended there, not at the end of the run
    assert done.returncode == 1


def test_the_suite_uses_the_signal_method() -> None:
    options = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["pytest"]
    assert options["ini_options"]["timeout_method"] == "signal"
