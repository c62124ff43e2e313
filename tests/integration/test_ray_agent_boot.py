"""The embedded Ray starts with DLU's stand-in for Ray's minimal dashboard agent: the raylet
runs dlu_prime/ray_agent_stub.py and no `dashboard/agent.py`, Ray works (an actor answers),
and nothing of it outlives a SIGKILLed driver; `DLU_RAY_AGENT_STUB=0` brings Ray's agent back."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from cli_runs import short_dir
from proc_checks import descendants, processes

from dlu_prime import ray_private

pytestmark = [pytest.mark.ray, pytest.mark.timeout(240)]

DRIVER = """
import os, sys, time
import ray
from dlu_prime import ray_env
ray_env.init_local(log_to_driver=False)

@ray.remote(num_cpus=0)
class Echo:
    def pid(self):
        return os.getpid()

print("actor", ray.get(Echo.remote().pid.remote(), timeout=120), flush=True)
time.sleep(600)
"""


def _agents(stub: str) -> tuple[Path, subprocess.Popen[str], list[str]]:
    tmp = short_dir("dlu-stub-")
    out = Path(tmp) / "driver.out"
    env = {**os.environ, "RAY_TMPDIR": tmp, ray_private.AGENT_STUB_ENV: stub}
    with out.open("w") as sink:
        driver = subprocess.Popen(
            [sys.executable, "-c", DRIVER], env=env, stdout=sink, stderr=subprocess.STDOUT, text=True
        )
    deadline = time.monotonic() + 180
    while "actor" not in out.read_text():
        assert driver.poll() is None, out.read_text()[-3000:]
        assert time.monotonic() < deadline, out.read_text()[-3000:]
        time.sleep(0.2)
    table = processes()
    ours = descendants(table, driver.pid)
    return out, driver, [table[pid].cmdline for pid in ours if pid in table]


def test_the_raylet_runs_the_stub_and_ray_works() -> None:
    out, driver, commands = _agents("1")
    try:
        assert any("ray_agent_stub.py" in c for c in commands), commands
        assert not any("dashboard/agent.py" in c for c in commands), commands
        stubs = [
            p
            for p, proc in processes().items()
            if "ray_agent_stub.py" in proc.cmdline and out.parent.name in proc.cmdline
        ]
        assert stubs, "the stub's command names this Ray's session dir"
    finally:
        driver.send_signal(signal.SIGKILL)
        driver.wait()
    deadline = time.monotonic() + 30
    while any(p in processes() for p in stubs):
        assert time.monotonic() < deadline, "the stub outlived its Ray"
        time.sleep(0.2)


def test_the_stub_can_be_turned_off() -> None:
    _, driver, commands = _agents("0")
    try:
        assert any("dashboard/agent.py" in c for c in commands), commands
        assert not any("ray_agent_stub.py" in c for c in commands), commands
    finally:
        driver.send_signal(signal.SIGKILL)
        driver.wait()
