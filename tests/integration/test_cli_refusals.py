"""`dlu run` of a job that cannot run here is refused before anything starts: exit code 2 (the
CLI's usage-error code), the field named, and no Ray session, zygote or other process behind.

Each run gets a private DLU_HOME, RAY_TMPDIR and DLU_ZYGOTE_DIR, so what it would have started
is found by those paths: in the directories, and in the command line or environment of every
process this user can read.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(120)

HERE = Path(__file__).parent
DLU = str(Path(sys.executable).parent / "dlu")
EXIT_USAGE = 2  # dlu_api.cli: "2 usage errors"

# An elastic role: a local run that got past the checks would start this node's zygote (torch
# preloaded) next to the embedded Ray.
SPEC = """
name: {name}
device_type: CPU
device_per_node: 0
roles:
  - name: trainer
    kind: elastic
    entrypoint: {entrypoint}
    resources: {{cpu: {cpu}, memory: {memory}}}
    elastic: {{nnodes: 1, nproc_per_node: 1}}
"""


@dataclass
class Run:
    code: int
    stderr: str
    markers: tuple[str, ...]  # the private paths: DLU_HOME, RAY_TMPDIR, DLU_ZYGOTE_DIR


@pytest.fixture
def private_dirs(tmp_path: Path) -> Iterator[tuple[str, ...]]:
    """DLU_HOME, RAY_TMPDIR and DLU_ZYGOTE_DIR of one run; whatever a failing run left running
    (found by these paths) is ended by its pid afterwards."""
    dirs = (
        str(tmp_path / "home"),
        tempfile.mkdtemp(prefix="dlu-refuse-ray-", dir="/tmp"),
        tempfile.mkdtemp(prefix="dlu-rz-", dir="/tmp"),  # short: a socket path
    )
    yield dirs
    for pid, _ in processes_with(dirs):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    for directory in dirs[1:]:
        shutil.rmtree(directory, ignore_errors=True)


def dlu_run(
    tmp_path: Path,
    dirs: tuple[str, ...],
    name: str,
    entrypoint: str,
    cpu: float,
    memory: str = "256MiB",
) -> Run:
    spec = tmp_path / f"{name}.yaml"
    spec.write_text(SPEC.format(name=name, entrypoint=entrypoint, cpu=cpu, memory=memory))
    home, ray_tmp, zygotes = dirs
    env = {**os.environ, "DLU_HOME": home, "RAY_TMPDIR": ray_tmp, "DLU_ZYGOTE_DIR": zygotes}
    done = subprocess.run(
        [DLU, "run", str(spec)], cwd=HERE, env=env, capture_output=True, text=True, timeout=90
    )
    return Run(done.returncode, done.stderr, dirs)


def processes_with(markers: tuple[str, ...]) -> list[tuple[int, str]]:
    """(pid, command line) of the processes whose command line or environment holds a marker."""
    found: list[tuple[int, str]] = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            seen = (entry / "cmdline").read_bytes() + (entry / "environ").read_bytes()
        except OSError:
            continue
        if any(m.encode() in seen for m in markers):
            command = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            found.append((int(entry.name), command))
    return found


def assert_nothing_started(run: Run) -> None:
    home, ray_tmp, zygotes = (Path(m) for m in run.markers)
    assert list(Path(ray_tmp).iterdir()) == [], "an embedded Ray started (its session dir exists)"
    assert list(Path(zygotes).iterdir()) == [], "a zygote started (its socket exists)"
    assert not (home / "jobs").exists(), "a job status file was written"
    assert processes_with(run.markers) == []


def test_a_missing_script_is_refused_before_ray_or_a_zygote_starts(
    tmp_path: Path, private_dirs: tuple[str, ...]
) -> None:
    run = dlu_run(tmp_path, private_dirs, "no-script", "no_such_train.py --steps 3", cpu=0.1)
    assert run.code == EXIT_USAGE, run.stderr
    assert "roles[trainer].entrypoint: script" in run.stderr
    assert "no_such_train.py' does not exist" in run.stderr
    assert "fix the script path in roles[trainer].entrypoint" in run.stderr
    assert "Traceback" not in run.stderr
    assert_nothing_started(run)


def test_more_memory_than_this_machine_has_is_refused_before_anything_starts(
    tmp_path: Path, private_dirs: tuple[str, ...]
) -> None:
    # CPUs are oversubscribed on a local run (as torchrun does); memory the machine lacks is not.
    run = dlu_run(tmp_path, private_dirs, "too-big", "elastic_script.py", cpu=0.1, memory="64TiB")
    assert run.code == EXIT_USAGE, run.stderr
    assert "roles[trainer].resources.memory: the job needs" in run.stderr
    assert "but this machine has" in run.stderr
    assert "lower roles[trainer].resources.memory (or roles[trainer].total)" in run.stderr
    assert "Traceback" not in run.stderr
    assert_nothing_started(run)
