"""Per-rank log files of a real local job: 2 elastic ranks (forked from the zygote) and a simple
role's actor, each rank's stdout and stderr in its own files, a restarted rank appending, `dlu logs`
selecting one rank, and `--tee` mirroring rank output on `dlu run`'s terminal."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from cli_runs import DLU, Box, wait_until

pytestmark = [pytest.mark.ray, pytest.mark.timeout(300)]

SPEC = """
name: {name}
device_type: CPU
device_per_node: 0
health: {{monitor_interval_s: 0.2}}
logs: {{tee: "{tee}"}}
roles:
  - name: trainer
    kind: elastic
    entrypoint: rank_log_script.py
    resources: {{cpu: 0.25}}
    max_restart: 3
    env: {{OUT_DIR: {out}}}
    elastic: {{nnodes: 1, nproc_per_node: 2, node_check: {{enabled: false}}, setup_process_group: false}}
  - name: helper
    entrypoint: workloads:print_rank
    resources: {{cpu: 0.1}}
"""


def _run(box: Box, tmp_path: Path, name: str, tee: str) -> tuple[str, Path]:
    """Run the job to its end; (what `dlu run` printed, the run's log folder)."""
    out = tmp_path / f"out-{name}"
    out.mkdir()
    spec = tmp_path / f"{name}.yaml"
    spec.write_text(SPEC.format(name=name, out=out, tee=tee))
    run = box.start(spec)
    wait_until(lambda: run.proc.poll() is not None, "the end of dlu run", timeout_s=240)
    output = run.output()
    assert run.proc.returncode == 0, output[-4000:]
    record = box.record(name)
    assert record is not None
    status = record["status"]
    assert status["run_id"], status
    assert status["log_dir"] == str(box.home / "logs"), status
    return output, box.home / "logs" / name / status["run_id"]


def test_rank_files_restart_and_dlu_logs(box: Box, tmp_path: Path) -> None:
    output, folder = _run(box, tmp_path, "rank-logs", tee="0")
    files = sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file())
    assert files == [
        "helper/rank0.err",
        "helper/rank0.out",
        "trainer/rank0.err",
        "trainer/rank0.out",
        "trainer/rank1.err",
        "trainer/rank1.out",
    ]
    for rank in ("0", "1"):
        out = (folder / "trainer" / f"rank{rank}.out").read_text()
        err = (folder / "trainer" / f"rank{rank}.err").read_text()
        for route in ("py-stdout", "fd-stdout", "child-stdout"):  # Python, C level, a child
            assert f"{route} rank {rank} attempt 1" in out, out
        assert f"py-stderr rank {rank} attempt 1" in err and "py-stdout" not in err, err
        assert out.count("==== dlu: trainer/rank") == 2, out  # one marker per start
        assert f"rank {'0' if rank == '1' else '1'} attempt" not in out  # no other rank's lines
    # rank 1 printed, failed, and its second start appended below (rank 0's first attempt may be
    # ended by the restart before it prints)
    first = (folder / "trainer" / "rank1.out").read_text().split("==== dlu: ")
    assert "py-stdout rank 1 attempt 0" in first[1] and "py-stdout rank 1 attempt 1" in first[2], first
    assert "rank 1 fails on purpose" in (folder / "trainer" / "rank1.err").read_text()
    helper = (folder / "helper" / "rank0.out").read_text()
    assert "simple-stdout rank 0" in helper and "simple-child rank 0" in helper, helper
    assert "simple-stderr rank 0" in (folder / "helper" / "rank0.err").read_text()
    assert "py-stdout rank" not in output  # without tee, rank output is not on dlu run's terminal

    one = box.dlu("logs", "rank-logs", "--rank", "1")
    assert one.returncode == 0, one.stderr
    lines = one.stdout.splitlines()
    assert "[trainer/rank1] py-stdout rank 1 attempt 1" in lines, one.stdout
    assert "[trainer/rank1:err] rank 1 fails on purpose" in lines, one.stdout
    assert all(line.startswith(("[trainer/rank1]", "[trainer/rank1:err]")) for line in lines), one.stdout

    helper_only = box.dlu("logs", "rank-logs", "--role", "helper")
    assert helper_only.returncode == 0, helper_only.stderr
    assert "[helper/rank0] simple-stdout rank 0" in helper_only.stdout.splitlines()
    assert "trainer" not in helper_only.stdout

    followed = box.dlu("logs", "rank-logs", "-f", "--role", "trainer", "--rank", "0")  # a stopped job: ends
    assert followed.returncode == 0, followed.stderr
    assert "[trainer/rank0] fd-stdout rank 0 attempt 1" in followed.stdout.splitlines()

    unknown = box.dlu("logs", "rank-logs", "--role", "nope")
    assert unknown.returncode == 2 and "no role 'nope'; its roles: trainer, helper" in unknown.stderr

    events = box.dlu("events", "rank-logs")
    assert events.returncode == 0 and json.loads(events.stdout.splitlines()[0])["kind"]


def test_tee_prints_prefixed_rank_lines(box: Box, tmp_path: Path) -> None:
    output, folder = _run(box, tmp_path, "rank-tee", tee="1")
    lines = output.splitlines()
    assert "[trainer/rank1] py-stdout rank 1 attempt 0" in lines, output[-4000:]
    assert "[trainer/rank1] child-stdout rank 1 attempt 1" in lines, output[-4000:]
    assert "[trainer/rank0] py-stdout rank 0 attempt 1" in lines, output[-4000:]
    assert "[helper/rank0] simple-stdout rank 0" in lines, output[-4000:]
    assert not any("py-stderr" in line for line in lines), output[-4000:]  # tee 1: stdout only
    assert "py-stderr rank 0 attempt 0" in (folder / "trainer" / "rank0.err").read_text()


FOREVER = """
name: {name}
device_type: CPU
device_per_node: 0
health: {{monitor_interval_s: 0.2}}
roles:
  - name: ticker
    entrypoint: workloads:print_forever
    total: 2
    resources: {{cpu: 0.1}}
"""


def test_follow_a_running_job_from_another_terminal(box: Box, tmp_path: Path) -> None:
    """`dlu logs -f --rank 1` of a job another `dlu run` runs: new lines as they come, rank 1's
    only, and it ends by itself once the job is stopped."""
    spec = tmp_path / "ticks.yaml"
    spec.write_text(FOREVER.format(name="ticks"))
    run = box.start(spec)
    wait_until(lambda: box.stage("ticks") == "RUNNING", "the job RUNNING", run)
    env = box.env(box.new_dir("dlu-cli-"))
    follower = subprocess.Popen(
        [DLU, "logs", "ticks", "-f", "--rank", "1"], env=env, stdout=subprocess.PIPE, text=True
    )
    try:
        assert follower.stdout is not None
        seen: list[str] = []
        while len(seen) < 5:  # lines keep coming while the job runs
            line = follower.stdout.readline()
            assert line, f"the follower ended early after {seen}"
            seen.append(line.rstrip("\n"))
        assert all(line.startswith("[ticker/rank1] ") for line in seen), seen
        ticks = [int(line.split()[2]) for line in seen if " tick " in line]
        assert ticks == sorted(ticks) and len(set(ticks)) == len(ticks), seen  # in order, none twice
        stopped = box.dlu("stop", "ticks")
        assert stopped.returncode == 0, stopped.stderr
        rest, _ = follower.communicate(timeout=120)  # it ends on its own once the job stopped
        assert follower.returncode == 0
        assert "[ticker/rank0]" not in rest
    finally:
        if follower.poll() is None:
            follower.kill()
    wait_until(lambda: run.proc.poll() is not None, "the end of dlu run", timeout_s=120)
