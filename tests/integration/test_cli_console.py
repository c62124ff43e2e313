"""What a user sees of `dlu run`: the live view in a terminal (a real pseudo-terminal), and
nothing of Ray's own warnings or the actors' logs unless `--verbose`.

The terminal run trains the reference LM (2 ranks) with one training process crashing at step
10: the final screen must show the role table with the final step, the in-place restart counted
by tier and its recovery with a duration, and the whole output no Ray warning.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest
from cli_runs import DLU, HERE, Box
from terminal import ANSI, ERASE_LINE, final_screen, run_in_terminal, terminal_contents

pytestmark = [pytest.mark.ray, pytest.mark.slow, pytest.mark.timeout(300)]

ROOT = HERE.parents[1]
NOISE = (
    "Scheduling a restartable detached actor",
    "Token authentication",
    "WARNING",
    " INFO ",
    "(PrimeMaster pid=",
    "(WorkerActor pid=",
    "Traceback",
)

CRASH_JOB = """
name: console-crash
device_type: CPU
device_per_node: 0
node_num: 2
health: {{monitor_interval_s: 0.2}}
roles:
  - name: trainer
    kind: elastic
    entrypoint: examples/elastic/train_lm.py --steps 16 --step-seconds 0.1 --checkpoint-every 4 --crash-at-step 10 --crash-rank 1 --checkpoint-dir {ckpt}
    resources: {{cpu: 0.25}}
    elastic: {{nnodes: 2, nproc_per_node: 1, node_check: {{enabled: false}}}}
"""

HELLO_JOB = """
name: {name}
device_type: CPU
device_per_node: 0
config: {{steps: 3}}
roles:
  - name: worker
    entrypoint: examples.hello.workers:main
    total: 2
    resources: {{cpu: 0.25}}
"""


def test_the_live_view_of_a_run_with_a_crash(box: Box, tmp_path: Path) -> None:
    spec = tmp_path / "crash.yaml"
    spec.write_text(CRASH_JOB.format(ckpt=tmp_path / "ckpt"))
    env = box.env(box.new_dir("dlu-cli-"), COLUMNS="120", LINES="40", TERM="xterm-256color")
    env.pop("DLU_VERBOSE", None)
    code, output = run_in_terminal([DLU, "run", str(spec)], env, ROOT)
    plain = ANSI.sub("", output)
    assert code == 0, plain[-4000:]
    assert (tmp_path / "ckpt" / "crashed-at-10").exists()  # the crash really happened

    assert output.count(ERASE_LINE) > 0, "no live view was drawn"
    assert any("RUNNING" in frame and "steps/s" in frame for frame in output.split(ERASE_LINE))
    screen = final_screen(output)
    assert "job console-crash  STOPPED (exit code 0)" in screen, screen
    row = next((line for line in screen.splitlines() if line.startswith("trainer")), "")
    assert "2 FINISH" in row and " 16 " in row and "1 in place" in row, screen
    assert "SubMaster" not in screen, screen
    assert "restarts: in place 1" in screen, screen
    assert "root cause: trainer.1" in screen and "injected crash at step 10" in screen, screen
    assert re.search(r"inplace_restart  recovered in \d+\.\d\ds \(in_place tier\)", screen), screen
    for noise in NOISE:
        assert noise not in plain, f"{noise!r} shown without --verbose:\n{plain[-4000:]}"


FOREVER_JOB = """
name: console-ctrl-c
device_type: CPU
device_per_node: 0
health: {monitor_interval_s: 0.2}
roles:
  - name: worker
    entrypoint: workloads:forever
    total: 2
    resources: {cpu: 0.1}
"""


def test_ctrl_c_in_the_live_view_stops_the_job_and_leaves_its_final_screen(box: Box, tmp_path: Path) -> None:
    spec = tmp_path / "forever.yaml"
    spec.write_text(FOREVER_JOB)
    env = box.env(box.new_dir("dlu-cli-"), COLUMNS="120", LINES="40", TERM="xterm-256color")
    env.pop("DLU_VERBOSE", None)
    interrupted: list[float] = []

    def interrupt_once_training(output: str, pid: int) -> None:
        frame = ANSI.sub("", output.rsplit(ERASE_LINE, 1)[-1])  # the latest frame (or part of it)
        if not interrupted and "2 RUNNING" in frame and "steps/s" in frame:
            interrupted.append(time.monotonic())
            os.kill(pid, signal.SIGINT)  # as Ctrl-C

    code, output = run_in_terminal([DLU, "run", str(spec)], env, HERE, on_output=interrupt_once_training)
    plain = ANSI.sub("", output)
    assert interrupted, f"the live view never showed the job training:\n{plain[-4000:]}"
    assert code == 130, plain[-4000:]
    assert "interrupted: stopping job console-ctrl-c" in plain
    kept = terminal_contents(output)  # the notice stays above the live view, not drawn over by it
    assert any(line.startswith("interrupted: stopping job console-ctrl-c") for line in kept), kept
    screen = final_screen(output)
    assert "job console-ctrl-c  STOPPED (exit code 130)" in screen, screen
    assert "reason: stopped by user request" in screen, screen
    row = next((line for line in screen.splitlines() if line.startswith("worker")), "")
    assert "2 STOPPED" in row, screen
    record = box.record("console-ctrl-c")
    assert record is not None and record["status"]["exit_code"] == 130


TEE_JOB = """
name: console-tee
device_type: CPU
device_per_node: 0
config: {steps: 3}
logs: {tee: 1}
roles:
  - name: worker
    entrypoint: examples.hello.workers:main
    total: 2
    resources: {cpu: 0.25}
"""


def test_the_live_view_keeps_the_ranks_tee_lines_above_it(box: Box, tmp_path: Path) -> None:
    """What the ranks print (`logs.tee`) is printed above the live view and stays in the
    terminal; the final screen is drawn once, with no stale header line left above it."""
    spec = tmp_path / "tee.yaml"
    spec.write_text(TEE_JOB)
    env = box.env(box.new_dir("dlu-cli-"), COLUMNS="120", LINES="40", TERM="xterm-256color")
    env.pop("DLU_VERBOSE", None)
    code, output = run_in_terminal([DLU, "run", str(spec)], env, ROOT)
    plain = ANSI.sub("", output)
    assert code == 0, plain[-4000:]
    assert output.count(ERASE_LINE) > 0, "no live view was drawn"
    kept = terminal_contents(output)
    for rank in (0, 1):
        tee = [line for line in kept if line.startswith(f"[worker/rank{rank}]")]
        assert tee, f"rank {rank}'s tee'd lines were wiped:\n" + "\n".join(kept)
    headers = [line for line in kept if line.startswith("job console-tee")]
    assert len(headers) == 1 and headers[0].startswith("job console-tee  STOPPED (exit code 0)"), kept
    last_tee = max(i for i, line in enumerate(kept) if line.startswith("[worker/rank"))
    assert last_tee < kept.index(headers[-1]), kept  # above the final screen


def test_quiet_by_default_and_verbose_shows_ray_and_our_actors_logs(box: Box, tmp_path: Path) -> None:
    """Into a pipe: one plain line per event either way; `--verbose` adds what Ray forwards (our
    actors' logs). What the workers print goes to their rank files either way, and to the
    terminal only when tee'd (`logs.tee`, test_rank_logs.py)."""
    outputs: dict[bool, str] = {}
    for verbose in (False, True):
        spec = tmp_path / f"hello-{verbose}.yaml"
        spec.write_text(HELLO_JOB.format(name=f"console-hello-{int(verbose)}"))
        env = box.env(box.new_dir("dlu-cli-"))
        env.pop("DLU_VERBOSE", None)
        args = [DLU, "run", *(["--verbose"] if verbose else []), str(spec)]
        done = subprocess.run(args, cwd=ROOT, env=env, capture_output=True, text=True, timeout=240)
        assert done.returncode == 0, done.stdout + done.stderr
        outputs[verbose] = done.stdout + done.stderr
    for output in outputs.values():
        assert ERASE_LINE not in output  # not a terminal: no live view
        assert "READY -> RUNNING" in output and "role_finished" in output
        assert "job console-hello-" in output and "STOPPED (exit code 0)" in output
    assert "did 3 steps" not in outputs[False] and "(PrimeMaster pid=" not in outputs[False]
    assert "\x1b[" not in outputs[False]
    assert "did 3 steps" not in outputs[True]  # in the rank files, not forwarded by Ray
    assert "(PrimeMaster pid=" in outputs[True]
