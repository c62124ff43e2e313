"""The stand-in for Ray's minimal dashboard agent (dlu_prime.ray_agent_stub): put in the raylet's
command only where Ray would run its minimal agent; writes the port files Ray's agent writes;
ends when its parent (the raylet) does."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dlu_prime import ray_agent_stub, ray_private

pytestmark = pytest.mark.timeout(60)

AGENT = "/site/ray/dashboard/agent.py"
NODE = "ab" * 28


def agent_command(*extra: str) -> str:
    return (
        f"--dashboard_agent_command=/usr/bin/python3 -u {AGENT} --node-id={NODE} --session-dir=/s"
        + "".join(f" {e}" for e in extra)
    )


def alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_the_minimal_agent_is_replaced_and_nothing_else() -> None:
    command = [
        "/site/ray/core/src/ray/raylet/raylet",
        "--python_worker_command=x",
        agent_command("--minimal"),
    ]
    changed = ray_private.with_agent_stub(command, AGENT)
    assert changed[:2] == command[:2]
    assert changed[2] == command[2].replace(AGENT, ray_private.AGENT_STUB_SCRIPT)
    assert Path(ray_private.AGENT_STUB_SCRIPT).is_file()


def test_a_full_agent_is_kept() -> None:
    """With `ray[default]` Ray's agent exports metrics: it stays."""
    command = ["raylet", agent_command("--head")]
    assert ray_private.with_agent_stub(command, AGENT) == command


def test_the_opt_out(monkeypatch: pytest.MonkeyPatch) -> None:
    assert ray_private.agent_stub_enabled()
    monkeypatch.setenv(ray_private.AGENT_STUB_ENV, "0")
    assert not ray_private.agent_stub_enabled()


def test_the_stub_writes_the_ports_then_ends_with_its_parent(tmp_path: Path) -> None:
    """A parent process starts the stub as the raylet does, then is killed: the stub has written
    Ray's three port files ("-1": not in use) and ends."""
    pid_file = tmp_path / "stub.pid"
    parent = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import subprocess, sys, time\n"
            f"p = subprocess.Popen([sys.executable, {ray_private.AGENT_STUB_SCRIPT!r}, '--node-id={NODE}', "
            f"'--session-dir={tmp_path}', '--minimal', '--logging-format=%(message)s x'])\n"
            f"open({str(pid_file)!r}, 'w').write(str(p.pid))\n"
            "time.sleep(600)\n",
        ]
    )
    try:
        deadline = time.monotonic() + 30
        names = [tmp_path / f"{name}_{NODE}" for name in ray_agent_stub.PORT_NAMES]
        while not (pid_file.is_file() and pid_file.read_text() and all(p.is_file() for p in names)):
            assert time.monotonic() < deadline, sorted(os.listdir(tmp_path))
            time.sleep(0.05)
        assert [p.read_text() for p in names] == ["-1"] * 3
        stub = int(pid_file.read_text())
        assert Path(f"/proc/{stub}").exists()
    finally:
        parent.kill()
        parent.wait()
    deadline = time.monotonic() + 20
    while alive(stub):
        assert time.monotonic() < deadline, "the stub outlived its parent"
        time.sleep(0.1)
