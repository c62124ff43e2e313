"""A 60-step reference job (0.1 s/step) with one crash at step 20: `dlu run` start to exit,
and `dlu run` start to the job's first training step.

The real CLI runs as a subprocess, as a user would run it (quiet, its default; `--verbose` runs
`dlu run --verbose`), so the figures include everything a user waits for: the CLI's imports,
the embedded Ray it starts, the job (node check on, one training process raising at step 20,
recovered in place from the step-20 checkpoint) and the shutdown. Each run gets a fresh
temporary folder for its spec (examples/elastic/job.yaml with the entrypoint changed), its
checkpoints, its private Ray (`RAY_TMPDIR`), its `DLU_HOME` and its own zygote directory:
every run starts cold, as a first `dlu run` on a machine does (the zygote `dlu run` starts
outlives it by minutes). `--warm-zygote` shares one zygote between the runs instead, after an
uncounted run that starts it: a `dlu run` soon after another.

DLU's own packages are byte-compiled first: they are installed editable, so neither
`UV_COMPILE_BYTECODE` nor a first import (this machine sets PYTHONDONTWRITEBYTECODE=1) writes
their bytecode, and every process would compile them again (0.2 s of CPU per process that
imports them, seven processes per run); an installed DLU has its bytecode, as its users get.

A run counts only if `dlu run` exited 0, the crash happened (the training script's marker
file), training finished (its final loss file) and the job recorded an in-place restart. The
first step is the wall-clock time rank 0 wrote when its first step ended (train_lm.py's
`--first-step-file`). The output lines are timestamped as they arrive, which gives each run's
breakdown (rank 0's lines reach `dlu run` through its rank log file, polled every 0.2 s, or
with `--verbose` through Ray's log monitor, so those marks can be late by a few 100 ms).
`--trace` prints, per run, every process it started with its CPU time and the job's events
on one timeline (benchmarks/e2e_trace.py).

Prints one line per run, the breakdown's medians, then FIGURE lines (benchmarks/figures.py).
Usage: `uv run python benchmarks/job_e2e.py [runs] [--warm-zygote] [--verbose] [--trace]`
(default 3 runs).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from figures import compile_workspace, figure

ROOT = Path(__file__).resolve().parents[1]
DLU = str(Path(sys.executable).parent / "dlu")
STEPS, STEP_S, CRASH_AT, CRASH_RANK = 60, 0.1, 20, 1
BUDGET_S = 10.0  # DESIGN section 9
FIRST_STEP_BUDGET_S = 4.0  # DESIGN section 9: `dlu run` start -> first training step
RUN_TIMEOUT_S = 300.0

# (mark, text of the first output line that sets it), in the order they happen.
MARKS: tuple[tuple[str, str], ...] = (
    ("ray_up", "Started a local Ray instance"),
    ("submitted", "] stage INIT"),
    ("running", "] stage RUNNING"),
    ("crashed", "inplace_restart"),
    ("resumed", "resumed from step"),
    ("trained", "final loss"),
    ("stopped", "] stage STOPPED"),
)
# breakdown rows: (short name, label, from mark, to mark); "start" and "exit" are the process's
# own, "first_step" the time rank 0's first step ended (train_lm.py's --first-step-file)
PHASES: tuple[tuple[str, str, str, str], ...] = (
    ("start", "CLI start + Ray start (--verbose only)", "start", "ray_up"),
    ("submit", "Ray up -> job submitted (--verbose only)", "ray_up", "submitted"),
    ("boot", "CLI start -> job submitted (imports, Ray, PrimeMaster)", "start", "submitted"),
    ("ready", "submitted -> RUNNING (actors, node check)", "submitted", "running"),
    ("first", "RUNNING -> first step (rendezvous, forks, process group, model)", "running", "first_step"),
    ("steps1", "first step -> crash recorded (first steps)", "first_step", "crashed"),
    ("recover", "crash recorded -> resumed", "crashed", "resumed"),
    ("steps2", "resumed -> final loss (last steps)", "resumed", "trained"),
    ("stop", "final loss -> STOPPED", "trained", "stopped"),
    ("exit", "STOPPED -> exit (report, shutdown)", "stopped", "exit"),
)


@dataclass
class Run:
    """One `dlu run`: its exit status, wall time and when each mark's line arrived."""

    code: int
    seconds: float
    marks: dict[str, float] = field(default_factory=dict[str, float])
    output: list[str] = field(default_factory=list[str])

    def phase(self, start: str, end: str) -> float | None:
        if start in self.marks and end in self.marks:
            return self.marks[end] - self.marks[start]
        return None


def write_spec(folder: Path, run: int) -> Path:
    """The reference job with a 60-step entrypoint that crashes once at step 20."""
    from dlu_api.spec import load_spec

    data = load_spec(ROOT / "examples/elastic/job.yaml").model_dump(mode="json")
    data["name"] = f"bench-e2e-{run}"
    data["roles"][0]["entrypoint"] = (
        f"examples/elastic/train_lm.py --steps {STEPS} --step-seconds {STEP_S} "
        f"--crash-at-step {CRASH_AT} --crash-rank {CRASH_RANK} --checkpoint-dir {folder / 'ckpt'} "
        f"--first-step-file {folder / 'first_step'}"
    )
    path = folder / "job.json"
    path.write_text(json.dumps(data), encoding="utf-8")
    return path


@dataclass(frozen=True)
class Mode:
    """How the runs are made: `verbose` runs `dlu run --verbose` (Ray's log monitor forwards
    worker output, as before this figure was measured quiet); `trace` prints each run's
    processes, CPU and events (e2e_trace.py); `warm_zygote` shares one zygote."""

    verbose: bool = False
    trace: bool = False
    warm_zygote: bool = False


def run_cli(spec: Path, folder: Path, zygotes: Path, mode: Mode = Mode()) -> Run:
    """Run `dlu run SPEC` as a user does and stamp every output line with the time since the
    process started."""
    env = {
        **os.environ,
        "RAY_TMPDIR": str(folder / "ray"),
        "DLU_HOME": str(folder / "home"),
        "DLU_ZYGOTE_DIR": str(zygotes),
        "PYTHONUNBUFFERED": "1",
    }
    (folder / "ray").mkdir()
    sampler = None
    if mode.trace:
        from e2e_trace import Sampler

        sampler = Sampler(str(folder))
        sampler.start()
    t0_wall = time.time()
    t0 = time.perf_counter()
    proc = subprocess.Popen(
        [DLU, "run", *(["--verbose"] if mode.verbose else []), str(spec)],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    watchdog = threading.Timer(RUN_TIMEOUT_S, proc.kill)
    watchdog.start()
    run = Run(code=-1, seconds=0.0, marks={"start": 0.0})
    assert proc.stdout is not None
    for line in proc.stdout:
        now = time.perf_counter() - t0
        run.output.append(line.rstrip("\n"))
        for mark, text in MARKS:
            if mark not in run.marks and text in line:
                run.marks[mark] = now
    run.code = proc.wait()
    watchdog.cancel()
    run.seconds = run.marks["exit"] = time.perf_counter() - t0
    with contextlib.suppress(OSError, ValueError):
        run.marks["first_step"] = float((folder / "first_step").read_text()) - t0_wall
    if sampler is not None:
        from e2e_trace import job_events, report

        time.sleep(1.0)  # what outlives the CLI, seen going
        sampler.stop()
        record = next((folder / "home" / "jobs").glob("*.json"), folder / "none")
        for line in report(sampler, t0_wall, run.marks, job_events(record)):
            print(line, flush=True)
    return run


def check(run: Run, folder: Path, name: str) -> None:
    """Fail unless the job succeeded, really crashed at step 20 and recovered in place."""
    tail = "\n".join(run.output[-40:])
    if run.code != 0:
        raise SystemExit(f"dlu run exited {run.code}:\n{tail}")
    ckpt = folder / "ckpt"
    if not (ckpt / f"crashed-at-{CRASH_AT}").exists():
        raise SystemExit(f"no crash happened at step {CRASH_AT}:\n{tail}")
    if not (ckpt / "final_loss.txt").exists():
        raise SystemExit(f"training did not finish:\n{tail}")
    record = json.loads((folder / "home" / "jobs" / f"{name}.json").read_text(encoding="utf-8"))
    status = record["status"]
    restarts = sum(role.get("inplace_restart_count", 0) for role in status["roles"])
    if status["stage"] != "STOPPED" or status["exit_code"] != 0 or restarts < 1:
        raise SystemExit(
            f"job status says otherwise: {status['stage']}, exit {status['exit_code']}, "
            f"{restarts} in-place restart(s)"
        )


def leftovers(folder: Path) -> list[int]:
    """Pids of processes still naming this run's folder (its Ray, its zygote and their children)."""
    needle = str(folder)
    found: list[int] = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if needle in cmdline:
            found.append(int(entry.name))
    return found


def end_leftovers(folder: Path, grace_s: float = 5.0) -> int:
    """Stop what the run left behind after `grace_s` (by pid: this run's own processes only)."""
    deadline = time.monotonic() + grace_s
    while leftovers(folder) and time.monotonic() < deadline:
        time.sleep(0.1)
    pids = leftovers(folder)
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    return len(pids)


def stop_zygotes(directory: Path) -> None:
    """The zygotes this benchmark's runs started (they outlive `dlu run` on purpose)."""
    from dlu_prime import zygote

    zygote.stop_all(directory)


def one_run(run_index: int, shared_zygotes: Path | None, mode: Mode = Mode()) -> Run:
    """One checked run in a fresh folder; its own cold zygote unless `shared_zygotes` is given."""
    folder = Path(tempfile.mkdtemp(prefix="dlu-e2e-", dir="/tmp"))
    zygotes = shared_zygotes or folder / "z"
    zygotes.mkdir(exist_ok=True)
    try:
        spec = write_spec(folder, run_index)
        run = run_cli(spec, folder, zygotes, mode)
        if shared_zygotes is None:
            stop_zygotes(zygotes)
        left = end_leftovers(folder)
        check(run, folder, f"bench-e2e-{run_index}")
        if left:
            print(f"  warning: {left} process(es) of the run outlived `dlu run` and its zygote", flush=True)
        return run
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def fmt(value: float | None) -> str:
    return "    -" if value is None else f"{value:5.2f}"


def report(index: int | str, run: Run) -> None:
    parts = " ".join(f"{key} {fmt(run.phase(a, b)).strip()}" for key, _, a, b in PHASES)
    first = fmt(run.marks.get("first_step")).strip()
    print(
        f"run {index}: dlu run start -> exit {run.seconds:.2f} s, -> first step {first} s, exit 0, "
        f"crash recovered; {parts}",
        flush=True,
    )


def timed_runs(runs: int, mode: Mode) -> list[Run]:
    if not mode.warm_zygote:
        return [one_run(index, None, mode) for index in range(runs)]
    shared = Path(tempfile.mkdtemp(prefix="dlu-e2e-z-", dir="/tmp"))
    try:
        report("warm-up (not counted)", one_run(runs, shared, mode))
        return [one_run(index, shared, mode) for index in range(runs)]
    finally:
        stop_zygotes(shared)
        shutil.rmtree(shared, ignore_errors=True)


def main(runs: int = 3, mode: Mode = Mode()) -> None:
    compile_workspace()
    done: list[Run] = []
    for index, run in enumerate(timed_runs(runs, mode)):
        report(index, run)
        done.append(run)
    total = statistics.median(r.seconds for r in done)
    firsts = [r.marks["first_step"] for r in done if "first_step" in r.marks]
    print(f"breakdown (median of {runs} runs, seconds):")
    for _, label, start, end in PHASES:
        values = [v for r in done if (v := r.phase(start, end)) is not None]
        print(f"  {fmt(statistics.median(values) if values else None)}  {label}")
    zygote = ("warm zygote" if mode.warm_zygote else "cold zygote") + (", --verbose" if mode.verbose else "")
    print(
        f"dlu run start -> exit, 60 steps, one crash, {zygote} (median of {runs}): {total:.2f} s "
        f"(budget {BUDGET_S:g} s); load average {os.getloadavg()[0]:.1f}"
    )
    if len(firsts) < len(done):
        raise SystemExit("a run wrote no first-step time (train_lm.py --first-step-file)")
    first = statistics.median(firsts)
    print(
        f"dlu run start -> first training step, node check on, {zygote} (median of {runs}): "
        f"{first:.2f} s (budget {FIRST_STEP_BUDGET_S:g} s)"
    )
    figure(
        "job_e2e_start_to_first_step",
        first,
        "s",
        FIRST_STEP_BUDGET_S,
        label="`dlu run` start -> first training step, node check on, embedded Ray started by it",
    )
    figure(
        "job_e2e_60_steps_one_crash",
        total,
        "s",
        BUDGET_S,
        label="60-step job, one crash: `dlu run` start (embedded Ray) to exit",
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("runs", type=int, nargs="?", default=3)
    parser.add_argument("--warm-zygote", action="store_true", help="share one zygote between the runs")
    parser.add_argument(
        "--trace", action="store_true", help="print each run's processes, CPU and events (e2e_trace.py)"
    )
    parser.add_argument("--verbose", action="store_true", help="run `dlu run --verbose`")
    args = parser.parse_args()
    main(args.runs, Mode(verbose=args.verbose, trace=args.trace, warm_zygote=args.warm_zygote))
