"""`dlu run --no-wait` on this machine: it returns once the job is RUNNING, the job goes on in a
detached `dlu run` (its own session), and `dlu status`, `dlu stop` and `dlu list` reach it. Even
from a terminal it draws no live view: plain lines, and plain lines in the detached run's log."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from cli_runs import DLU, HERE, Box, wait_until
from terminal import ANSI, ERASE_LINE, run_in_terminal

pytestmark = [pytest.mark.ray, pytest.mark.slow, pytest.mark.timeout(300)]

FOREVER = """
name: {name}
device_type: CPU
device_per_node: 0
roles:
  - name: worker
    entrypoint: workloads:forever
    resources: {{cpu: 0.1}}
"""


@pytest.fixture
def box(tmp_path: Path) -> Iterator[Box]:
    made = Box(tmp_path / "home")
    yield made
    record = made.record("nowait")
    if record is not None:  # a failed test must not leave the detached run behind
        with contextlib.suppress(ProcessLookupError):
            os.kill(int(record["pid"]), signal.SIGKILL)
    made.end()


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}/stat").is_file() and " Z " not in Path(f"/proc/{pid}/stat").read_text()


def test_run_no_wait_leaves_the_job_running_in_a_detached_process(box: Box, tmp_path: Path) -> None:
    spec = tmp_path / "nowait.yaml"
    spec.write_text(FOREVER.format(name="nowait"))

    def no_wait() -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [DLU, "run", "--no-wait", str(spec)],
            cwd=HERE,
            env=box.env(box.new_dir("dlu-cli-")),
            capture_output=True,
            text=True,
            timeout=240,
        )

    env = box.env(box.new_dir("dlu-cli-"), COLUMNS="120", TERM="xterm-256color")
    env.pop("DLU_VERBOSE", None)
    code, output = run_in_terminal([DLU, "run", "--no-wait", str(spec)], env, HERE)
    shown = ANSI.sub("", output)
    assert code == 0, shown
    assert ERASE_LINE not in output, f"a live view was drawn:\n{shown}"
    assert "job nowait is RUNNING in process" in shown
    assert "dlu stop nowait" in shown
    record = box.record("nowait")
    assert record is not None and record["status"]["stage"] == "RUNNING"
    pid = int(record["pid"])
    assert alive(pid) and os.getsid(pid) == pid  # detached: a session of its own
    assert str(pid) in shown

    again = no_wait()  # the name is taken: the detached run refuses, and says why
    assert again.returncode == 2, again.stdout + again.stderr
    assert "nowait" in again.stderr and alive(pid)

    status = json.loads(box.dlu("status", "nowait", "--json").stdout)
    assert status["stage"] == "RUNNING"
    stopped = box.dlu("stop", "nowait")
    assert stopped.returncode == 0, stopped.stderr
    wait_until(lambda: box.stage("nowait") == "STOPPED", "STOPPED", timeout_s=90)
    wait_until(lambda: not alive(pid), "the detached run's end", timeout_s=90)
    final = json.loads(box.dlu("status", "nowait", "--json").stdout)
    assert final["exit_code"] == 130
    listed = {j["name"]: j for j in json.loads(box.dlu("list", "--json").stdout)}
    assert (listed["nowait"]["stage"], listed["nowait"]["exit_code"], listed["nowait"]["where"]) == (
        "STOPPED",
        130,
        "local",
    )
    console = box.home / "jobs" / "nowait.detached" / "console.log"
    log = console.read_text()
    assert "job nowait: STOPPED (exit code 130)" in log
    assert "\x1b[" not in log  # plain lines: no live view into a file
