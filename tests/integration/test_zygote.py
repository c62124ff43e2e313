"""The node's zygote (dlu_prime.zygote): shared, outliving its starter, replaced when
gone, exiting when idle. Real processes; a private socket directory per test."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from proc_checks import gone, processes

from dlu_elastic.worker import process as process_module
from dlu_elastic.worker.process import ProcessEventKind, ProcessSpec, TrainingLauncher
from dlu_elastic.worker.warmup import PRELOAD
from dlu_prime import zygote

HERE = Path(__file__).resolve().parent
LIGHT = ("dlu_elastic.worker.process",)  # no torch: a zygote that starts in a second
# A launcher adds its preload list to the default one (torch, 7 s of imports here, far more on a
# loaded machine): `light_launcher` clears the default, for the tests of the zygote's protocol,
# which torch does not change. The tests of what torch changes keep it: the two launchers' test
# (torch preloaded, its objects frozen) and the zygote started by another process.
LIGHT_LAUNCHER_CODE = "from dlu_elastic.worker import process; process.PRELOAD = ()\n"


def light_launcher(monkeypatch: pytest.MonkeyPatch) -> TrainingLauncher:
    """A launcher whose zygote preloads LIGHT only (no torch)."""
    monkeypatch.setattr(process_module, "PRELOAD", ())
    launcher = TrainingLauncher(preload=LIGHT)
    assert launcher.preload == list(LIGHT)
    return launcher


@pytest.fixture
def zygote_dir(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """Named by this pytest's pid: the folders of a pytest that is gone (killed, timed out before
    its teardown) are removed here, with their zygotes."""
    for stale in Path("/tmp").glob("dlu-zt-*-*"):
        owner = stale.name.split("-")[2]
        if owner.isdigit() and not Path(f"/proc/{owner}").exists():
            _end_zygotes_of(stale)
    directory = Path(f"/tmp/dlu-zt-{os.getpid()}-{time.monotonic_ns() % 10**9}")
    directory.mkdir()
    monkeypatch.setenv(zygote.DIR_ENV, str(directory))
    yield directory
    zygote.stop_all(directory)
    _end_zygotes_of(directory)


def _end_zygotes_of(directory: Path) -> None:
    """SIGKILL the zygotes of `directory` by command line (one still importing answers no ping),
    then remove it."""
    for proc in processes().values():
        if "dlu_prime.zygote" in proc.cmdline and f"--socket {directory}/" in proc.cmdline:
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGKILL)
    shutil.rmtree(directory, ignore_errors=True)


def _wait(condition: object, timeout_s: float = 20.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if callable(condition) and condition():
            return True
        time.sleep(0.05)
    return False


def _zygote_pid(path: Path) -> int:
    return int(zygote.request(path, {"op": "ping"}, 60.0)["pid"])


def _describe(launcher: TrainingLauncher, out: Path, **env: str) -> dict[str, Any]:
    proc = launcher.start(
        ProcessSpec("elastic_workloads:describe_process", env={"OUT_DIR": str(out), **env}, workdir=str(HERE),
                    setup_process_group=False)
    )  # fmt: skip
    assert proc.wait(60) == 0, proc.last_failure
    return json.loads((out / f"process-{proc.pid}.json").read_text())


@pytest.mark.timeout(120)
def test_processes_of_two_launchers_in_two_processes_come_from_one_zygote(
    zygote_dir: Path, tmp_path: Path
) -> None:
    launcher = TrainingLauncher()
    launcher.warm_up()
    path = zygote.socket_path(PRELOAD)
    pid = _zygote_pid(path)
    here = _describe(launcher, tmp_path, TMPDIR=str(tmp_path))
    assert here["ppid"] == pid and here["pgid"] == here["pid"] and here["torch_preloaded"] is True
    # torch cached the zygote's TMPDIR; the child goes by its own (the zygote's may be gone)
    assert here["tempdir"] == str(tmp_path)
    # torch's objects, preloaded, are out of the child's collections (it collects its own)
    assert here["frozen_objects"] > 100_000 and here["gc_enabled"] is True
    other = textwrap.dedent(f"""
        import json
        from dlu_elastic.worker.process import ProcessSpec, TrainingLauncher
        launcher = TrainingLauncher()
        proc = launcher.start(ProcessSpec("elastic_workloads:describe_process", env={{"OUT_DIR": {str(tmp_path)!r}}},
                                          workdir={str(HERE)!r}, setup_process_group=False))
        print(json.dumps({{"code": proc.wait(60), "pid": proc.pid, "warm": launcher.warm_up()}}))
    """)
    result = subprocess.run([sys.executable, "-c", other], capture_output=True, text=True, timeout=100)
    assert result.returncode == 0, result.stderr[-2000:]
    answer = json.loads(result.stdout.strip().splitlines()[-1])
    assert answer["code"] == 0
    there = json.loads((tmp_path / f"process-{answer['pid']}.json").read_text())
    assert there["ppid"] == pid, "the second process started a zygote of its own"
    assert f"stdout of pid {answer['pid']}" in result.stdout, (
        "the child did not write to its launcher's stdout"
    )


@pytest.mark.timeout(120)
def test_child_takes_the_launchers_environment_and_sys_path(
    zygote_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    launcher = light_launcher(monkeypatch)
    launcher.warm_up()  # the zygote starts with the environment as it is now
    monkeypatch.setenv("DLU_TEST_MARKER", "set-after-the-zygote-started")
    extra = str(tmp_path / "extra-path")
    monkeypatch.setattr(sys, "path", [*sys.path, extra])
    seen = _describe(launcher, tmp_path, DLU_TEST_EXTRA_PATH=extra)
    assert seen["marker"] == "set-after-the-zygote-started"
    assert seen["sys_path_has_extra"] is True


@pytest.mark.timeout(120)
def test_zygote_outlives_the_process_that_started_it(zygote_dir: Path) -> None:
    starter = "from dlu_elastic.worker.process import TrainingLauncher; TrainingLauncher().warm_up()"
    subprocess.run([sys.executable, "-c", starter], check=True, timeout=100)
    path = zygote.socket_path(PRELOAD)
    pid = _zygote_pid(path)
    launcher = TrainingLauncher()
    launcher.warm_up()
    assert _zygote_pid(path) == pid, "a second zygote was started instead of using the running one"
    assert launcher.preloaded is True


@pytest.mark.timeout(120)
def test_a_killed_zygote_is_replaced_and_its_running_child_is_reported(
    zygote_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    launcher = light_launcher(monkeypatch)
    launcher.warm_up()
    path = zygote.socket_path(launcher.preload)
    old = _zygote_pid(path)
    running = launcher.start(
        ProcessSpec("elastic_workloads:hang", env={"OUT_DIR": str(tmp_path)}, workdir=str(HERE),
                    setup_process_group=False)
    )  # fmt: skip
    assert _wait(lambda: (tmp_path / "hang.json").exists())
    os.kill(old, signal.SIGKILL)
    assert running.wait(20) == -signal.SIGKILL
    assert "zygote" in (running.last_failure or "")
    record = json.loads((tmp_path / "hang.json").read_text())
    assert _wait(lambda: gone(record["pid"]) and gone(record["child"])), "the orphaned group was left running"
    seen = _describe(launcher, tmp_path)
    assert seen["ppid"] != old
    assert _zygote_pid(path) == seen["ppid"]


@pytest.mark.timeout(60)
def test_idle_zygote_exits_and_removes_its_socket(zygote_dir: Path) -> None:
    path = zygote.ensure_started(LIGHT, idle_s=1.0)
    pid = _zygote_pid(path)
    assert _wait(lambda: gone(pid), 15.0), "the idle zygote did not exit"
    assert not path.exists()


@pytest.mark.timeout(60)
def test_stale_socket_and_bad_requests(zygote_dir: Path) -> None:
    path = zygote.socket_path(LIGHT)
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stale.bind(str(path))  # bound, never listening: what a killed zygote leaves
    stale.close()
    assert zygote.ensure_started(LIGHT) == path
    pid = _zygote_pid(path)
    answer = zygote.request(path, {"op": "explode"}, 10.0)
    assert "unknown op" in str(answer.get("error"))
    assert _zygote_pid(path) == pid, "a bad request ended the zygote"


@pytest.mark.timeout(120)
def test_ranks_starting_together_get_children_forked_ahead(
    zygote_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    launcher = light_launcher(monkeypatch)
    launcher.warm_up()
    path = zygote.socket_path(launcher.preload)

    def spares() -> list[int]:
        return list(zygote.request(path, {"op": "ping"}, 10.0)["spares"])

    assert _wait(lambda: len(spares()) >= 1)
    burst = [_describe(launcher, tmp_path) for _ in range(3)]  # three starts within 2 s
    assert len({seen["pid"] for seen in burst}) == 3
    assert _wait(lambda: len(spares()) >= 3), "the pool did not grow to the burst"
    ahead = set(spares())
    seen = _describe(launcher, tmp_path)
    assert seen["pid"] in ahead, "a start did not use a child forked ahead"
    assert seen["pgid"] == seen["pid"]


@pytest.mark.timeout(120)
def test_children_are_forked_ahead_only_once_a_burst_is_over(
    zygote_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A fork right after a restart's burst would delay the zygote's next answers (and exit
    reports) and take CPU from the new processes: the pool waits for the requests to stop."""
    monkeypatch.setenv(zygote.REFILL_QUIET_ENV, "8")
    launcher = light_launcher(monkeypatch)
    launcher.warm_up()
    path = zygote.socket_path(launcher.preload)

    def spares() -> list[int]:
        return list(zygote.request(path, {"op": "ping"}, 10.0)["spares"])

    assert _wait(lambda: len(spares()) >= 1)  # the first one comes at once
    burst = [_describe(launcher, tmp_path) for _ in range(2)]
    assert len({seen["pid"] for seen in burst}) == 2
    assert spares() == [], "forked ahead while the burst had just ended"
    assert _wait(lambda: len(spares()) >= 2, timeout_s=40.0), "the pool was not refilled after the burst"


@pytest.mark.timeout(120)
def test_every_child_of_a_killed_zygote_is_reported_whether_forked_ahead_or_not(
    zygote_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Starts at once outrun the forks ahead, so some children are forked on request: none of
    them may keep its client's connection open (the client would never learn the zygote died)."""
    from concurrent.futures import ThreadPoolExecutor

    launcher = light_launcher(monkeypatch)
    launcher.warm_up()
    old = _zygote_pid(zygote.socket_path(launcher.preload))
    spec = ProcessSpec(
        "elastic_workloads:hang_ignoring_sigterm", workdir=str(HERE), setup_process_group=False
    )
    with ThreadPoolExecutor(4) as pool:
        procs = list(pool.map(lambda _: launcher.start(spec), range(4)))
    for proc in procs:  # each runs its workload (its first heartbeat came)
        assert _wait(
            lambda p=proc: (
                any(e.kind is ProcessEventKind.HEARTBEAT for e in p.events()) or p.poll() is not None
            )
        )
        assert proc.poll() is None, proc.last_failure
    os.kill(old, signal.SIGKILL)
    assert [p.wait(20) for p in procs] == [-signal.SIGKILL] * 4


@pytest.mark.timeout(120)
def test_a_child_whose_requester_died_is_killed_by_the_zygote_even_when_stopped(
    zygote_dir: Path, tmp_path: Path
) -> None:
    """The child's own watch cannot run in a stopped (or GIL-blocked) process: the zygote ends a
    child whose requester's connection closed. While the requester lives, nothing is killed,
    over several of the zygote's 1 s loop periods."""
    agent_code = LIGHT_LAUNCHER_CODE + textwrap.dedent(f"""
        import sys, time
        from dlu_elastic.worker.process import ProcessSpec, TrainingLauncher
        launcher = TrainingLauncher(preload={LIGHT!r})
        launcher.start(ProcessSpec("elastic_workloads:hang", env={{"OUT_DIR": {str(tmp_path)!r}}},
                                   workdir={str(HERE)!r}, setup_process_group=False))
        print("started", flush=True)
        time.sleep(600)
    """)
    agent = subprocess.Popen([sys.executable, "-c", agent_code], stdout=subprocess.PIPE, text=True)
    try:
        assert _wait(lambda: (tmp_path / "hang.json").exists(), 60), "the training process did not start"
        record = json.loads((tmp_path / "hang.json").read_text())
        os.kill(record["pid"], signal.SIGSTOP)  # its die-with-requester thread cannot run now
        time.sleep(5.0)  # the soak: its requester lives, so the zygote leaves it alone
        assert not gone(record["pid"]) and not gone(record["child"])
        agent.kill()
        agent.wait(10)
        assert _wait(lambda: gone(record["pid"]) and gone(record["child"])), (
            "a stopped training process outlived its requester"
        )
    finally:
        agent.kill()
        agent.wait(10)
        for pid in ("pid", "child"):
            with contextlib.suppress(Exception):
                os.kill(json.loads((tmp_path / "hang.json").read_text())[pid], signal.SIGKILL)
