"""The stand-in for Ray's minimal dashboard agent (dlu_prime.ray_agent_stub): put in the raylet's
command only where Ray would run its minimal agent; writes the port files Ray's agent writes;
ends when its parent (the raylet) does."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

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
    Ray's three port files ("-1": not in use), stays while the parent lives, and then ends."""
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
        written = [p.stat().st_mtime_ns for p in names]
        time.sleep(ray_agent_stub.PARENT_POLL_S * 10)  # soak: its parent lives, it does nothing
        assert alive(stub)
        assert [p.stat().st_mtime_ns for p in names] == written
    finally:
        parent.kill()
        parent.wait()
    deadline = time.monotonic() + 20
    while alive(stub):
        assert time.monotonic() < deadline, "the stub outlived its parent"
        time.sleep(0.1)


def test_lean_head_starts_the_stub_and_polls_the_gcs_port_sooner_then_restores_ray(tmp_path: Path) -> None:
    """Inside lean_head, Ray's own process starter gets the raylet command with the stub, and
    the wait for the GCS's port file polls every PORT_POLL_MS; both restored afterwards."""
    import importlib

    node: Any = importlib.import_module("ray._private.node")  # private names, read as Any
    services: Any = importlib.import_module("ray._private.services")

    before = (services.start_ray_process, node.wait_for_persisted_port)
    agent = os.path.join(services.RAY_PATH, "dashboard", "agent.py")
    seen: list[list[str]] = []
    polls: list[int] = []

    def fake_start(command: list[str], process_type: str, *args: object, **kwargs: object) -> str:
        seen.append(command)
        return "started"

    def fake_wait(*args: object, poll_interval_ms: int = 100, **kwargs: object) -> int:
        polls.append(poll_interval_ms)
        return 1234

    services.start_ray_process = fake_start
    node.wait_for_persisted_port = fake_wait
    try:
        with ray_private.lean_head(skip_api_server=True, worker_script=None, stub_agent=True):
            command = ["raylet", f"--dashboard_agent_command=/py -u {agent} --node-id={NODE} --minimal"]
            assert services.start_ray_process(command, "raylet", True) == "started"
            assert node.wait_for_persisted_port(str(tmp_path), NODE, "gcs_server_port", timeout_ms=1) == 1234
        assert services.start_ray_process is fake_start and node.wait_for_persisted_port is fake_wait
    finally:
        services.start_ray_process, node.wait_for_persisted_port = before
    assert seen == [["raylet", command[1].replace(agent, ray_private.AGENT_STUB_SCRIPT)]]
    assert polls == [ray_private.PORT_POLL_MS]
