"""`dlu run` on an embedded Ray, stopped by `dlu stop` from another process or by Ctrl-C."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from short_tmp import short_tmp_dir

pytestmark = [pytest.mark.ray, pytest.mark.timeout(180)]

HERE = Path(__file__).parent
DLU = str(Path(sys.executable).parent / "dlu")

SPEC = """
name: {name}
device_type: CPU
device_per_node: 0
health: {{monitor_interval_s: 0.2}}
roles:
  - name: worker
    entrypoint: workloads:forever
    total: 2
    resources: {{cpu: 0.1}}
"""


def _env(home: Path) -> dict[str, str]:
    return {
        **os.environ,
        "DLU_HOME": str(home),
        "RAY_TMPDIR": short_tmp_dir("dlu-cli-"),
    }


def _ignore_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # as `dlu run ... &` in a non-interactive shell


def _start(
    tmp_path: Path, name: str, ignore_sigint: bool = False
) -> tuple[subprocess.Popen[str], dict[str, str]]:
    spec = tmp_path / f"{name}.yaml"
    spec.write_text(SPEC.format(name=name))
    env = _env(tmp_path / "home")
    proc = subprocess.Popen(
        [DLU, "run", str(spec)],
        cwd=HERE,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        preexec_fn=_ignore_sigint if ignore_sigint else None,
    )
    job_file = tmp_path / "home" / "jobs" / f"{name}.json"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if job_file.is_file() and json.loads(job_file.read_text())["status"]["stage"] == "RUNNING":
            return proc, env
        if proc.poll() is not None:
            pytest.fail(f"dlu run ended early: {proc.communicate()[0][-3000:]}")
        time.sleep(0.3)
    _end(proc)
    pytest.fail("the job never reached RUNNING")


def _end(proc: subprocess.Popen[str]) -> None:
    """Never leave a `dlu run` (and its embedded Ray) behind when a test fails."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()


@pytest.mark.parametrize("ignore_sigint", [False, True], ids=["plain", "sigint-ignored"])
def test_dlu_stop_from_another_process(tmp_path: Path, ignore_sigint: bool) -> None:
    """Also when the `dlu run` ignores SIGINT (started in the background by a script): `dlu stop`
    returns once the job has stopped, and says so."""
    proc, env = _start(tmp_path, "cli-stop", ignore_sigint)
    try:
        _check_stop(proc, env)
        again = subprocess.run([DLU, "stop", "cli-stop"], env=env, capture_output=True, text=True, timeout=60)
        assert again.returncode == 0, again.stderr
        assert "job cli-stop is already stopped: STOPPED (exit code 130)" in again.stdout
        logs = tmp_path / "home" / "logs" / "cli-stop"
        assert logs.is_dir()
        deleted = subprocess.run(
            [DLU, "delete", "cli-stop"], env=env, capture_output=True, text=True, timeout=60
        )
        assert deleted.returncode == 0, deleted.stderr
        assert not logs.exists()  # its rank logs went with its record
    finally:
        _end(proc)


def _check_stop(proc: subprocess.Popen[str], env: dict[str, str]) -> None:
    stopped = subprocess.run([DLU, "stop", "cli-stop"], env=env, capture_output=True, text=True, timeout=120)
    assert stopped.returncode == 0, stopped.stdout + stopped.stderr
    assert "job cli-stop stopped: STOPPED (exit code 130)" in stopped.stdout
    out, _ = proc.communicate(timeout=90)
    assert proc.returncode == 130, out[-3000:]
    assert "stopped by user request" in out
    status = subprocess.run(
        [DLU, "status", "cli-stop", "--json"], env=env, capture_output=True, text=True, timeout=60
    )
    reported = json.loads(status.stdout)
    assert reported["stage"] == "STOPPED" and reported["exit_code"] == 130
    listed = subprocess.run([DLU, "list"], env=env, capture_output=True, text=True, timeout=60)
    assert listed.stdout.splitlines()[1].split()[:3] == ["cli-stop", "STOPPED", "130"]


def test_ctrl_c_stops_the_job_cleanly(tmp_path: Path) -> None:
    proc, env = _start(tmp_path, "cli-sigint")
    try:
        started = _ray_processes(env["RAY_TMPDIR"])
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=90)
    finally:
        _end(proc)
    assert proc.returncode == 130, out[-3000:]
    assert "interrupted: stopping job cli-sigint" in out
    assert "STOPPED" in out
    # the embedded Ray runs without the API server and the autoscaler monitor (unused locally)
    assert any("raylet" in cmd for cmd in started), started
    assert not [cmd for cmd in started if "dashboard.py" in cmd or "autoscaler" in cmd]
    # and every process of it is gone once `dlu run` has exited
    deadline = time.monotonic() + 10
    while _ray_processes(env["RAY_TMPDIR"]) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _ray_processes(env["RAY_TMPDIR"]) == []


def _ray_processes(ray_tmpdir: str) -> list[str]:
    """Command lines of the processes of the Ray that keeps its files in `ray_tmpdir`."""
    found: list[str] = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if ray_tmpdir in cmd:
            found.append(cmd)
    return found
