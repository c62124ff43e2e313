"""The detached `dlu run` that `dlu run --no-wait` starts on this machine: plain lines into its
console log, and `--verbose` passed on (a quiet run otherwise)."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest

from dlu_api.cli import detach
from dlu_api.spec.models import JobSpec

pytestmark = pytest.mark.timeout(30)

SPEC = JobSpec.model_validate(
    {
        "name": "demo",
        "device_type": "CPU",
        "device_per_node": 0,
        "roles": [{"name": "worker", "entrypoint": "pkg.mod:main", "total": 1}],
    }
)


class Started:
    """Stands in for subprocess.Popen: records the command line, starts nothing."""

    argv: list[str] = []
    options: dict[str, Any] = {}

    def __init__(self, argv: list[str], **options: Any) -> None:
        Started.argv, Started.options = argv, options


@pytest.mark.parametrize("verbose", [False, True])
def test_the_detached_run_writes_to_its_log_and_gets_verbose(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, verbose: bool
) -> None:
    monkeypatch.setattr(subprocess, "Popen", Started)
    _, console = detach.start_local(SPEC, tmp_path, verbose)
    assert console == tmp_path / "jobs" / "demo.detached" / "console.log"
    assert Started.argv[-1 if not verbose else -2].endswith("spec.json")
    assert ("--verbose" in Started.argv) is verbose
    assert Started.options["start_new_session"] is True
    assert Started.options["stdin"] is subprocess.DEVNULL
    assert Started.options["stdout"].name == str(console)  # a file: no terminal, no live view
