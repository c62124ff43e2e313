"""One job name, one `dlu run`; what a killed or twice-interrupted `dlu run` leaves behind.

Real `dlu run` processes on an embedded Ray: a second run of a running name is refused before it
starts anything; a run killed with SIGKILL leaves no process of its Ray session and no training
process, and its record reads LOST until the name runs again; two Ctrl-Cs stop a job at once and
still record it STOPPED with nothing left running.
"""

from __future__ import annotations

import json
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from cli_runs import DLU, HERE, Box, Run, session_processes, short_dir, wait_until
from proc_checks import Proc, processes, snapshot, still_alive

from dlu_api.cli import SECOND_INTERRUPT_REASON
from dlu_prime import job_lock

pytestmark = [pytest.mark.ray, pytest.mark.slow, pytest.mark.timeout(420)]

ELASTIC = """
name: {name}
device_type: CPU
device_per_node: 0
node_num: 1
health: {{monitor_interval_s: 0.2}}
roles:
  - name: trainer
    kind: elastic
    entrypoint: elastic_workloads:hang
    resources: {{cpu: 0.25}}
    env: {{OUT_DIR: {out}}}
    elastic: {{nnodes: 1, nproc_per_node: 1, node_check: {{enabled: false}}}}
"""

FOREVER = """
name: {name}
device_type: CPU
device_per_node: 0
roles:
  - name: worker
    entrypoint: workloads:forever
    resources: {{cpu: 0.1}}
"""

SLOW_TO_STOP = """
name: {name}
device_type: CPU
device_per_node: 0
health: {{monitor_interval_s: 0.2}}
roles:
  - name: worker
    entrypoint: workloads:SlowToStop
    total: 2
    resources: {{cpu: 0.1}}
"""


@pytest.fixture
def box(tmp_path: Path) -> Iterator[Box]:
    made = Box(tmp_path / "home", zygotes=short_dir("dlu-z-"))  # its own: what runs there is the run's
    yield made
    made.end()


def write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def session_of(run: Run, box: Box) -> list[Proc]:
    """The run's Ray session as it is now, checked to hold what a session has."""
    found = session_processes(run, box.zygotes)
    commands = " | ".join(p.cmdline for p in found)
    assert "raylet" in commands and "gcs_server" in commands and "ray::" in commands, commands
    return found


def gone_within(procs: list[Proc], what: str) -> None:
    """Generous for processes that die at once with their parent (or when the reaper's watcher
    sees the run end), and shorter than the minute Ray's agents would take on their own."""

    def report() -> str:
        watchers = [p.pid for p in processes().values() if "dlu_prime/reaper.py" in p.cmdline]
        return f"{'; '.join(describe(p) for p in still_alive(procs))} (watchers running: {watchers})"

    try:
        wait_until(lambda: not still_alive(procs), what, timeout_s=45)
    except pytest.fail.Exception:
        pytest.fail(f"no {what} within 45 s; still running: {report()}")


def describe(proc: Proc) -> str:
    """A survivor, with what the reaper looks for (its marker) and who its parent is now."""
    try:
        environ = Path(f"/proc/{proc.pid}/environ").read_bytes().split(b"\0")
    except OSError:
        environ = []
    marker = [e.decode() for e in environ if e.startswith(b"DLU_RAY_OWNER=")]
    now = snapshot(proc.pid)
    return f"{proc.pid} {proc.cmdline[:80]} (parent {now.ppid if now else '?'}, marker {marker})"


def test_one_name_runs_once_and_a_killed_run_leaves_nothing(box: Box, tmp_path: Path) -> None:
    name = "owned"
    out = tmp_path / "out"
    out.mkdir()
    spec = write(tmp_path / "job.yaml", ELASTIC.format(name=name, out=out))
    owner = box.start(spec)
    wait_until(lambda: box.stage(name) == "RUNNING", "RUNNING", owner)
    wait_until(lambda: (out / "hang.json").is_file(), "a training process", owner)
    hang = json.loads((out / "hang.json").read_text())
    training = [p for p in (snapshot(hang["pid"]), snapshot(hang["child"])) if p is not None]
    assert len(training) == 2, hang  # the training process and the child it started

    # A second run of the name is refused at once, naming the owner, and starts nothing.
    ray_dir, zygote_dir = box.new_dir("dlu-cli-"), box.new_dir("dlu-z-")
    refused = subprocess.run(
        [DLU, "run", str(spec)],
        cwd=HERE,
        env=box.env(ray_dir, DLU_ZYGOTE_DIR=zygote_dir),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert f"job {name!r} is already running on this machine, in process {owner.pid}" in refused.stderr
    assert f"`dlu stop {name}`" in refused.stderr and f"`kill {owner.pid}`" in refused.stderr
    assert list(Path(ray_dir).iterdir()) == [], "the refused run started a Ray"
    assert list(Path(zygote_dir).iterdir()) == [], "the refused run started a zygote"
    assert not [p for p in processes().values() if ray_dir in p.cmdline or zygote_dir in p.cmdline]
    assert box.stage(name) == "RUNNING" and (box.record(name) or {}).get("pid") == owner.pid

    # SIGKILL: no process of its Ray session and no training process survives it.
    session = session_of(owner, box)
    owner.proc.send_signal(signal.SIGKILL)
    owner.proc.wait(30)
    gone_within(session + training, "end of every process of the killed run's Ray session")

    # Its record reads LOST everywhere; `dlu stop` says it is not running.
    status = json.loads(box.dlu("status", name, "--json").stdout)
    assert status["stage"] == "LOST" and f"process {owner.pid}" in status["reason"], status
    listed = {j["name"]: j for j in json.loads(box.dlu("list", "--json").stdout)}
    assert (listed[name]["stage"], listed[name]["where"]) == ("LOST", "local")
    stopped = box.dlu("stop", name)
    assert stopped.returncode == 2 and "is not running (LOST)" in stopped.stderr, stopped.stderr
    assert box.stage(name) == "RUNNING"  # the record is kept as written; it is read as LOST

    # The name runs again; `kill PID` (SIGTERM, as the refusal suggested) stops it like Ctrl-C.
    # (A plain role this time: what matters is that the name is free.)
    rerun = box.start(write(tmp_path / "again.yaml", FOREVER.format(name=name)))
    wait_until(lambda: box.stage(name) == "RUNNING" and (box.record(name) or {}).get("pid") == rerun.pid,
               "the rerun RUNNING", rerun)  # fmt: skip
    rerun_session = session_of(rerun, box)
    rerun.proc.send_signal(signal.SIGTERM)
    assert rerun.proc.wait(180) == 130, rerun.output()[-3000:]
    record = box.record(name)
    assert record is not None
    assert (record["status"]["stage"], record["status"]["exit_code"]) == ("STOPPED", 130)
    assert job_lock.holder(box.home / "jobs" / f"{name}.lock") is None
    gone_within(rerun_session, "end of the rerun's Ray session")


def test_two_interrupts_stop_the_job_at_once_and_leave_nothing(box: Box, tmp_path: Path) -> None:
    name = "twice"
    run = box.start(write(tmp_path / "job.yaml", SLOW_TO_STOP.format(name=name)))
    wait_until(lambda: box.stage(name) == "RUNNING", "RUNNING", run)
    session = session_of(run, box)

    run.proc.send_signal(signal.SIGINT)
    # its actors take minutes to answer a stop: the clean stop is under way when the second comes
    wait_until(lambda: box.stage(name) == "STOPPING", "STOPPING", run)
    run.proc.send_signal(signal.SIGINT)
    assert run.proc.wait(180) == 130, run.output()[-3000:]

    output = run.output()
    assert (
        "interrupted: stopping job twice" in output
        and "interrupted again: stopping job twice at once" in output
    )
    record = box.record(name)
    assert record is not None
    final = record["status"]
    assert (final["stage"], final["exit_code"], final["reason"]) == ("STOPPED", 130, SECOND_INTERRUPT_REASON)
    assert {a["stage"] for r in final["roles"] for a in r["actors"]} == {"STOPPED"}
    # the end was written before the name was given up: read as STOPPED, not LOST
    assert json.loads(box.dlu("status", name, "--json").stdout)["stage"] == "STOPPED"
    gone_within(session, "end of every process of the interrupted run's Ray session")
