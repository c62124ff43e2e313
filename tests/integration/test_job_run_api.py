"""`Job(spec).run()` in a user's program: as quiet as `dlu run` (no Ray INFO logs or warnings),
and a Ctrl-C stops the job cleanly (recorded STOPPED, exit code 130), not LOST."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest
from cli_runs import HERE, Box, wait_until

pytestmark = [pytest.mark.ray, pytest.mark.timeout(240)]

NOISE = (" INFO ", "WARNING", "Started a local Ray instance", "(PrimeMaster pid=", "(WorkerActor pid=")


def test_ctrl_c_in_job_run_stops_the_job_and_run_is_quiet(box: Box, tmp_path: Path) -> None:
    env = box.env(box.new_dir("dlu-api-"))
    env.pop("DLU_VERBOSE", None)
    log = tmp_path / "driver.log"
    with log.open("w") as out:
        proc = subprocess.Popen(
            [sys.executable, "job_run_driver.py", "api-run"],
            cwd=HERE,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        wait_until(lambda: box.stage("api-run") == "RUNNING" or proc.poll() is not None, "RUNNING")
        assert proc.poll() is None, log.read_text()
        proc.send_signal(signal.SIGINT)
        assert proc.wait(120) == 130, log.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)
    output = log.read_text()
    assert "driver: interrupted" in output
    record = box.record("api-run")
    assert record is not None
    assert record["status"]["stage"] == "STOPPED", record["status"]
    assert record["status"]["exit_code"] == 130
    for noise in NOISE:
        assert noise not in output, f"{noise!r} shown by a quiet Job.run():\n{output[-4000:]}"
