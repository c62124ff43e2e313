"""A job file that starts its job when imported, run for real: the role's actor imports it to
run its entrypoint and submits the job again from inside itself. That inner submission is
refused with the fix (a `__main__` guard), not "already running: stop it or rename"; the job
stops at once with that reason, counted once, and nothing of it keeps running."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from cli_runs import HERE, Box

pytestmark = [pytest.mark.ray, pytest.mark.timeout(240)]


def test_a_job_submitted_from_inside_its_own_actor_is_refused_with_the_fix(box: Box, tmp_path: Path) -> None:
    env = box.env(box.new_dir("dlu-self-"))
    done = subprocess.run(
        [sys.executable, "self_submitting_job.py"],
        cwd=HERE,
        env=env,
        capture_output=True,
        text=True,
        timeout=200,
    )
    output = done.stdout + done.stderr
    assert done.returncode != 0, output
    record = box.record("self-submitting")
    assert record is not None, output
    status = record["status"]
    assert status["stage"] == "STOPPED", status
    reason = status["reason"]
    assert "submitted from inside its own actor self-submitting.worker.0" in reason, reason
    assert 'if __name__ == "__main__":' in reason, reason
    assert "already running" not in reason, reason
    assert output.count("driver: exit") == 1, output  # the inner import never ran a job of its own
