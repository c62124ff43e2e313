"""The reaper: whatever a process started while marked ends with it, SIGKILL of it included;
what it starts unmarked, and zygotes, are left alone."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(60)

# The starter: while marked, a child, a daemon (double fork: init's child, as Ray's agents
# become once the raylet is gone), a child that renames itself as Ray's processes do, and a
# "zygote"; unmarked, a bystander and a forked copy of itself that outlives it. Prints pids.
STARTER = """
import json, os, subprocess, sys, time
from dlu_prime import reaper
SLEEP = [sys.executable, "-c", "import time; time.sleep(120)"]
ZYGOTE = [sys.executable, "-c", "import time; time.sleep(120)", "-m", "dlu_prime.zygote"]
QUIET = "stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL"
DAEMON = f"import subprocess; print(subprocess.Popen({SLEEP!r}, start_new_session=True, {QUIET}).pid)"
# renames itself as Ray's processes do, with a title longer than its arguments
TITLED = [sys.executable, "-c", "import ray._raylet as r, time; r.setproctitle('ray::' + 'x' * 300); time.sleep(120)"]
with reaper.marked():
    child = subprocess.Popen(SLEEP)
    titled = subprocess.Popen(TITLED)
    zygote = subprocess.Popen(ZYGOTE, start_new_session=True)
    daemon = int(subprocess.run([sys.executable, "-c", DAEMON], capture_output=True,
                                text=True, check=True).stdout)
bystander = subprocess.Popen(SLEEP, start_new_session=True)
forked = os.fork()  # a copy of the starter that outlives it: it must not hold the watcher up
if forked == 0:
    os.setsid()
    time.sleep(120)
    os._exit(0)
print(json.dumps({"child": child.pid, "daemon": daemon, "titled": titled.pid, "zygote": zygote.pid,
                  "bystander": bystander.pid, "forked": forked}), flush=True)
sys.stdin.read()
"""


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


@pytest.fixture
def started() -> Iterator[tuple[subprocess.Popen[str], dict[str, int]]]:
    starter = subprocess.Popen(
        [sys.executable, "-c", STARTER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert starter.stdout is not None
    pids: dict[str, int] = json.loads(starter.stdout.readline())
    yield starter, pids
    if starter.poll() is None:
        starter.kill()
        starter.wait(30)
    for pid in pids.values():
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def wait_gone(pids: list[int], timeout_s: float = 30) -> list[int]:
    deadline = time.monotonic() + timeout_s
    while [p for p in pids if alive(p)] and time.monotonic() < deadline:
        time.sleep(0.1)
    return [p for p in pids if alive(p)]


@pytest.mark.parametrize("ending", ["sigkill", "exit"])
def test_what_a_process_started_while_marked_ends_with_it(
    ending: str, started: tuple[subprocess.Popen[str], dict[str, int]]
) -> None:
    starter, pids = started
    assert all(alive(p) for p in pids.values())
    # the renamed one has its new name (and kept its environment: SPT_NOENV)
    cmdline = Path(f"/proc/{pids['titled']}/cmdline")
    deadline = time.monotonic() + 30
    while not cmdline.read_bytes().startswith(b"ray::x") and time.monotonic() < deadline:
        time.sleep(0.05)
    assert cmdline.read_bytes().startswith(b"ray::x")
    if ending == "sigkill":
        starter.send_signal(signal.SIGKILL)
    else:
        assert starter.stdin is not None
        starter.stdin.close()  # it returns from main and exits normally
    starter.wait(30)
    assert wait_gone([pids["child"], pids["daemon"], pids["titled"]]) == []
    # started unmarked, or a zygote (a shared daemon with an idle exit): left alone
    time.sleep(0.5)
    assert alive(pids["bystander"]) and alive(pids["zygote"]) and alive(pids["forked"])


def test_the_marker_is_only_set_while_marked(monkeypatch: pytest.MonkeyPatch) -> None:
    from dlu_prime import reaper

    # A fresh marker: an earlier test of this process may have started Ray under the suite's
    # one, and its processes carry that. The watcher started here ends with this process.
    monkeypatch.setattr(reaper, "_marker", None)
    monkeypatch.setattr(reaper, "_watcher", None)
    assert reaper.MARKER_ENV not in os.environ and "SPT_NOENV" not in os.environ
    with reaper.marked():
        marker = os.environ[reaper.MARKER_ENV]
        assert os.environ["SPT_NOENV"] == "1"
    assert reaper.MARKER_ENV not in os.environ and "SPT_NOENV" not in os.environ
    with reaper.marked():
        assert os.environ[reaper.MARKER_ENV] == marker  # one watcher per process
    assert reaper.marked_processes(marker) == []  # nothing started: nothing carries it


def test_watching_says_whether_this_processs_watcher_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    """What lets `dlu run` exit without shutting its Ray down (LocalJobClient.close_at_exit)."""
    from dlu_prime import reaper

    with reaper.marked():
        pass
    assert reaper.watching()
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    monkeypatch.setattr(reaper, "_watcher", gone)  # a watcher that died: nothing is watched
    assert not reaper.watching()
    monkeypatch.setattr(reaper, "_watcher", None)  # never started (no /proc)
    assert not reaper.watching()
