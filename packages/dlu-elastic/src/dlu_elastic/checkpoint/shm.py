"""The agent's shared-memory folder: named after the agent, removed by it, swept if orphaned.

Each rank's agent (the ElasticWorker actor, whose process outlives the training processes it
forks) owns one folder `/dev/shm/dlu-ckpt.<agent pid>.<job>.<actor>`; its training process
writes its slots there (see slot.py), so they survive the process's crash and serve the next
one. The agent removes the folder when it stops; a folder whose agent pid is dead (a run that
was SIGKILLed) is removed by the next agent that starts on the host.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

logger = logging.getLogger(__name__)

# The training process finds its agent's folder here (set by the agent in the process's env).
FOLDER_ENV = "DLU_CHECKPOINT_SHM"
# Where the folders go (tests point it elsewhere); /dev/shm is memory on Linux.
ROOT_ENV = "DLU_CHECKPOINT_SHM_ROOT"
PREFIX = "dlu-ckpt."
PERSIST_DIR_ENV = "DLU_CHECKPOINT_PERSIST_DIR"
# Rank 0's load() leaves what it restored here, in its agent's folder; the agent reports it
# (an event with the step, the source and the steps lost; the lost-steps metric).
REPORT_FILE = "restored.json"


def root() -> Path:
    return Path(os.environ.get(ROOT_ENV) or "/dev/shm")


def _safe(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", text)[:80]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def owner_pid(folder: Path) -> int | None:
    parts = folder.name.removeprefix(PREFIX).split(".", 1)
    return int(parts[0]) if parts and parts[0].isdigit() else None


def sweep_stale(where: Path | None = None) -> list[Path]:
    """Remove the folders of agents that are gone (a SIGKILLed run); returns what was removed."""
    base = where or root()
    removed: list[Path] = []
    try:
        candidates = [p for p in base.iterdir() if p.name.startswith(PREFIX)]
    except FileNotFoundError:
        return removed
    for folder in candidates:
        pid = owner_pid(folder)
        if pid is None or _alive(pid):
            continue
        shutil.rmtree(folder, ignore_errors=True)
        removed.append(folder)
        logger.info("removed the checkpoint slots of a gone agent (pid %d): %s", pid, folder)
    return removed


def create(job: str, actor: str) -> Path:
    """This agent's folder (created empty; a leftover of this very pid is emptied first)."""
    sweep_stale()
    folder = root() / f"{PREFIX}{os.getpid()}.{_safe(job)}.{_safe(actor)}"
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(mode=0o700, parents=True)
    return folder


def remove(folder: Path) -> None:
    shutil.rmtree(folder, ignore_errors=True)


# The reaper: a tiny detached process (forked twice, so Ray's clean-up of the actor's children
# does not take it along) holding the read end of a pipe whose write end only the agent has.
# When the agent ends in any way (a stop, the SIGKILL of a job's clean-up, a crash), the pipe
# reads EOF and the reaper removes the folder: /dev/shm keeps nothing of a job that ended.
_REAPER = """
import os, shutil, sys
if os.fork():
    os._exit(0)
os.setsid()
while sys.stdin.buffer.read(65536):
    pass
shutil.rmtree(sys.argv[1], ignore_errors=True)
"""


def start_reaper(folder: Path) -> int:
    """Start the reaper of `folder`; returns the pipe's write end (keep it open; close = reap)."""
    read_end, write_end = os.pipe()
    try:
        proc = subprocess.Popen(
            [sys.executable, "-c", _REAPER, str(folder)],
            stdin=read_end,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            close_fds=True,
        )
        proc.wait()  # the intermediate exits at once; its child reaps
    finally:
        os.close(read_end)
    return write_end
