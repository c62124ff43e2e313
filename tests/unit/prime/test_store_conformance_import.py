"""The shipped store conformance suite needs pytest only when it is imported: dlu-prime itself
never depends on it (a cluster node has no pytest)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement

pytestmark = pytest.mark.timeout(60)

PRIME = Path(__file__).resolve().parents[3] / "packages" / "dlu-prime" / "pyproject.toml"


def _run(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=60
    )


def test_pytest_is_only_an_extra_of_dlu_prime() -> None:
    project = tomllib.loads(PRIME.read_text())["project"]
    assert "pytest" not in {Requirement(r).name for r in project["dependencies"]}
    assert {Requirement(r).name for r in project["optional-dependencies"]["testing"]} == {"pytest"}


def test_importing_dlu_prime_and_its_helpers_loads_no_pytest() -> None:
    proc = _run(
        """
        import sys
        import dlu_prime, dlu_prime.state, dlu_prime.testing, dlu_prime.testing.sim_scheduler
        import dlu_prime.master.state
        assert "pytest" not in sys.modules, "pytest was imported"
        """
    )
    assert proc.returncode == 0, proc.stderr


def test_the_suite_without_pytest_says_what_to_install() -> None:
    proc = _run(
        """
        import sys
        sys.modules["pytest"] = None  # as if it were not installed
        import dlu_prime.testing.store_conformance
        """
    )
    assert proc.returncode != 0
    assert "install dlu-prime[testing]" in proc.stderr
