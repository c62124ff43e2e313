"""The raylet's worker entry, in an interpreter without DLU, runs the Ray worker script that the
head put in the environment (it knows nothing of Ray's layout itself)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from dlu_prime import ray_private, ray_workers

pytestmark = pytest.mark.timeout(60)


def _entry(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    # -S -I: no site-packages, so dlu_prime cannot be imported, as in a runtime env's own Python
    return subprocess.run(
        [sys.executable, "-S", "-I", ray_workers.ENTRY_SCRIPT, "--a", "b"],
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
    )


def test_without_dlu_the_entry_runs_the_script_the_head_named(tmp_path: Path) -> None:
    script = tmp_path / "worker.py"
    script.write_text("import sys; print('worker', sys.argv[1:])")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = _entry({**env, ray_private.DEFAULT_WORKER_ENV: str(script)})
    assert done.returncode == 0 and "worker ['--a', 'b']" in done.stdout, done.stderr


def test_without_dlu_or_a_named_script_the_entry_says_why() -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", ray_private.DEFAULT_WORKER_ENV)}
    done = _entry(env)
    assert done.returncode != 0 and "no Ray worker script known" in done.stderr
