"""Real `dlu` commands in subprocesses, each test with its own DLU_HOME and each `dlu run` with
its own Ray temp dir, so that what a run started can be found by path. The runs share the
suite's zygote directory (tests/conftest.py), as the runs of one node share its zygotes: the
torch zygote is started once, not once per test (its imports cost each test seconds of CPU);
each Ray session's worker zygote is its own all the same (keyed to its raylet's settings)."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from proc_checks import Proc, descendants, processes

HERE = Path(__file__).parent
DLU = str(Path(sys.executable).parent / "dlu")
ZYGOTE_DIR_ENV = "DLU_ZYGOTE_DIR"  # dlu_prime.zygote.DIR_ENV (this module imports no DLU code)


def short_dir(prefix: str) -> str:
    """A new directory under /tmp: Ray's and the zygotes' socket paths must stay short."""
    return tempfile.mkdtemp(prefix=prefix, dir="/tmp")


@dataclass
class Run:
    """One `dlu run` process; its output goes to a file (a full pipe would block it)."""

    proc: subprocess.Popen[str]
    ray_tmpdir: str
    log: Path

    @property
    def pid(self) -> int:
        return self.proc.pid

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def end(self) -> None:
        """Never leave a `dlu run` (and its embedded Ray) behind when a test fails."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(30)


def suite_zygotes() -> str:
    """The suite's zygote directory; the session fixture `private_zygotes` names it."""
    return os.environ[ZYGOTE_DIR_ENV]


@dataclass
class Box:
    """The DLU_HOME one test's runs share, and their zygote directory (the suite's by default;
    a Box given its own ends the zygotes there at the end)."""

    home: Path
    zygotes: str = field(default_factory=suite_zygotes)
    runs: list[Run] = field(default_factory=list[Run])
    dirs: list[str] = field(default_factory=list[str])  # removed at the end

    def new_dir(self, prefix: str) -> str:
        made = short_dir(prefix)
        self.dirs.append(made)
        return made

    def env(self, ray_tmpdir: str, **extra: str) -> dict[str, str]:
        return {
            **os.environ,
            "DLU_HOME": str(self.home),
            "DLU_ZYGOTE_DIR": self.zygotes,
            "RAY_TMPDIR": ray_tmpdir,
            "TMPDIR": ray_tmpdir,  # what the run makes with tempfile (its metrics folder) goes too
            **extra,
        }

    def start(self, spec: Path, *options: str) -> Run:
        """`dlu run [OPTIONS] SPEC` in the background."""
        ray_tmpdir = self.new_dir("dlu-cli-")
        log = spec.with_suffix(f".{len(self.runs)}.log")
        with log.open("w") as out:
            proc = subprocess.Popen(
                [DLU, "run", *options, str(spec)],
                cwd=HERE,
                env=self.env(ray_tmpdir),
                stdout=out,
                stderr=subprocess.STDOUT,
                text=True,
            )
        run = Run(proc, ray_tmpdir, log)
        self.runs.append(run)
        return run

    def dlu(self, *args: str) -> subprocess.CompletedProcess[str]:
        """A `dlu` command beside the runs (status, list, stop)."""
        return subprocess.run(
            [DLU, *args], env=self.env(self.new_dir("dlu-cli-")), capture_output=True, text=True, timeout=120
        )

    def record(self, name: str) -> dict[str, Any] | None:
        """The job's record as its `dlu run` wrote it (None before the first write)."""
        try:
            found: dict[str, Any] = json.loads((self.home / "jobs" / f"{name}.json").read_text())
        except (OSError, ValueError):
            return None
        return found

    def stage(self, name: str) -> str | None:
        record = self.record(name)
        return None if record is None else str(record["status"]["stage"])

    def end(self) -> None:
        """End the runs, then the zygotes of a directory of this test's own (by pid: one still
        importing answers no ping); the suite's directory is the session fixture's to empty."""
        for run in self.runs:
            run.end()
        if self.zygotes != os.environ.get(ZYGOTE_DIR_ENV):
            for proc in processes().values():
                if "dlu_prime.zygote" in proc.cmdline and f"--socket {self.zygotes}/" in proc.cmdline:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(proc.pid, signal.SIGKILL)
            self.dirs.append(self.zygotes)
        for directory in self.dirs:
            shutil.rmtree(directory, ignore_errors=True)


def wait_until(
    condition: Callable[[], bool], what: str, run: Run | None = None, timeout_s: float = 180
) -> None:
    """Poll `condition` until it holds; fail naming `what` (with the run's output, if it ended)."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if run is not None and run.proc.poll() is not None:
            pytest.fail(f"dlu run ended (code {run.proc.returncode}) before {what}:\n{run.output()[-3000:]}")
        if time.monotonic() > deadline:
            pytest.fail(f"no {what} within {timeout_s:.0f} s" + (f":\n{run.output()[-3000:]}" if run else ""))
        time.sleep(0.1)


def session_processes(run: Run, zygote_dir: str) -> list[Proc]:
    """Every process of the run's embedded Ray session: what `dlu run` started (raylet, GCS,
    agents, the raylet's worker entries), whatever names its Ray temp dir, and its Ray workers
    (forked by a zygote of this test's directory, so not the run's descendants)."""
    table = processes()
    zygotes = {p.pid for p in table.values() if "dlu_prime.zygote" in p.cmdline and zygote_dir in p.cmdline}
    ours = descendants(table, run.pid)
    ours |= {p.pid for p in table.values() if run.ray_tmpdir in p.cmdline}
    ours |= {p.pid for p in table.values() if p.ppid in zygotes and p.cmdline.startswith("ray::")}
    return [table[pid] for pid in sorted(ours)]
