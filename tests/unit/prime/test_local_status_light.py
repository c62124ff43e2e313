"""`dlu status`, `list`, `stop` and `delete` of a local job read its files and import no Ray,
torch or gRPC (seconds on a loaded machine): each runs in a fresh interpreter that reports what
it imported."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from dlu_api.status import JobStage, JobStatus
from dlu_prime.job_files import JobFiles

HEAVY = ("ray", "torch", "grpc")
RUN_CLI = textwrap.dedent(
    f"""
    import json, sys
    from typer.testing import CliRunner
    from dlu_api.cli import app
    result = CliRunner().invoke(app, sys.argv[1:])
    print(json.dumps({{"code": result.exit_code, "output": result.output,
                      "heavy": sorted(m for m in {HEAVY!r} if m in sys.modules)}}))
    """
)


def _dlu(home: Path, *args: str) -> dict[str, object]:
    proc = subprocess.run(
        [sys.executable, "-c", RUN_CLI, *args],
        env={"DLU_HOME": str(home), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    found: dict[str, object] = json.loads(proc.stdout)
    return found


@pytest.mark.parametrize(
    ("args", "shown"),
    [
        (["status", "done"], "job done: STOPPED (exit code 0)"),
        (["status", "done", "--json"], '"stage": "STOPPED"'),
        (["list"], "NAME"),
        (["stop", "done"], "job done is already stopped"),
        (["delete", "done"], "deleted done"),
    ],
)
def test_local_job_commands_import_no_ray(tmp_path: Path, args: list[str], shown: str) -> None:
    JobFiles(tmp_path).write(JobStatus(name="done", stage=JobStage.STOPPED, exit_code=0), None)
    result = _dlu(tmp_path, *args)
    assert result["code"] == 0, result["output"]
    assert shown in str(result["output"])
    assert result["heavy"] == []
