"""The agent's shared-memory folder: named after the agent, removed by it, adopted or swept
once orphaned.

Each rank's agent (the ElasticWorker actor, whose process outlives the training processes it
forks) owns one folder `/dev/shm/dlu-ckpt.<agent pid>.<job>.<actor>`; its training process
writes its slots there (see slot.py), so they survive the process's crash and serve the next
one. The agent removes the folder when it stops. When it dies instead (Ray replaced the actor:
a role restart), its reaper keeps the folder for `ADOPT_GRACE_S`: the agent that replaces it on
the same host (same job, run and actor, so the same rank) adopts it by renaming it, once the
dead agent's training process is gone too, so the new agent starts with the slots and the
replicas its predecessor held. Whatever nobody adopts, the reaper removes; a folder whose agent
and reaper are both gone is removed by the next agent that starts on the host.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

logger = logging.getLogger(__name__)

# The training process finds its agent's folder here (set by the agent in the process's env).
FOLDER_ENV = "DLU_CHECKPOINT_SHM"
# Where the folders go (tests point it elsewhere); /dev/shm is memory on Linux.
ROOT_ENV = "DLU_CHECKPOINT_SHM_ROOT"
PREFIX = "dlu-ckpt."
GONE = ".gone."  # a folder being removed: renamed to `.gone.<remover pid>.<name>` first
PERSIST_DIR_ENV = "DLU_CHECKPOINT_PERSIST_DIR"
# Rank 0's load() leaves what it restored here, in its agent's folder; the agent reports it
# (an event with the step, the source and the steps lost; the lost-steps metric).
REPORT_FILE = "restored.json"
OWNER_FILE = "owner.json"  # {job, run, actor, node}: whose folder it is (adoption checks it)
TRAINER_FILE = "trainer.pid"  # the agent's current training process (adoption waits for its end)
ADOPTED_FILE = "adopted.json"  # left by an adopting agent for the next load() to report
LOCK_FILE = ".reaper.lock"  # a reaper holds a shared lock on it while it keeps the folder
# How long a dead agent's folder waits for its replacement (tests shorten it).
ADOPT_GRACE_ENV = "DLU_CHECKPOINT_ADOPT_GRACE_S"
ADOPT_GRACE_S = 120.0  # a role restart on a loaded host was seen taking 41 s: room for 3x that
# How long an adopting agent waits for its predecessor's processes to be gone.
ADOPT_WAIT_S = 10.0


def root() -> Path:
    return Path(os.environ.get(ROOT_ENV) or "/dev/shm")


def _safe(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", text)[:80]


def _alive(pid: int) -> bool:
    """Whether `pid` runs (a zombie, waiting for its parent to reap it, does not)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rsplit(")", 1)[-1].split()[0] != "Z"


def grace_s() -> float:
    return float(os.environ.get(ADOPT_GRACE_ENV) or ADOPT_GRACE_S)


def owner_pid(folder: Path) -> int | None:
    parts = folder.name.removeprefix(PREFIX).split(".", 1)
    return int(parts[0]) if parts and parts[0].isdigit() else None


def sweep_stale(where: Path | None = None) -> list[Path]:
    """Remove the folders of agents that are gone (a SIGKILLed run); returns what was removed."""
    base = where or root()
    removed: list[Path] = []
    try:
        candidates = [p for p in base.iterdir() if p.name.startswith(PREFIX)]
        doomed = [p for p in base.iterdir() if p.name.startswith(GONE)]
    except FileNotFoundError:
        return removed
    for folder in doomed:  # a removal cut short (its remover died): finish it
        pid = folder.name.removeprefix(GONE).split(".", 1)[0]
        if pid.isdigit() and not _alive(int(pid)):
            shutil.rmtree(folder, ignore_errors=True)
            removed.append(folder)
    for folder in candidates:
        pid = owner_pid(folder)
        if pid is None or _alive(pid) or _kept_by_reaper(folder):
            continue
        if _remove_whole(folder):
            removed.append(folder)
            logger.info("removed the checkpoint slots of a gone agent (pid %d): %s", pid, folder)
    return removed


def _kept_by_reaper(folder: Path) -> bool:
    """Whether a reaper still keeps `folder` for adoption (it holds the lock's shared side)."""
    try:
        fd = os.open(folder / LOCK_FILE, os.O_RDONLY)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


def _remove_whole(folder: Path) -> bool:
    """Remove `folder` unless someone renamed it first (an adopter): renamed away, then removed,
    so an adopter never takes a folder half removed. Returns whether this call removed it."""
    doomed = folder.with_name(f"{GONE}{os.getpid()}.{folder.name}")
    try:
        os.rename(folder, doomed)
    except OSError:
        return False
    shutil.rmtree(doomed, ignore_errors=True)
    return True


def _owner(folder: Path) -> dict[str, str] | None:
    try:
        found = json.loads((folder / OWNER_FILE).read_text())
    except (OSError, ValueError):
        return None
    return found if isinstance(found, dict) else None


def _trainer_pid(folder: Path) -> int | None:
    try:
        return int((folder / TRAINER_FILE).read_text())
    except (OSError, ValueError):
        return None


def adoptable(job: str, actor: str, run: str, node: str = "", where: Path | None = None) -> list[Path]:
    """Folders of dead agents of this very job, run and actor on this Ray node (newest first):
    a role restart's predecessor. The node is part of it: a replacement on another node of the
    same host (a test's Cluster) takes the place of a node whose memory is gone."""
    base = where or root()
    name = f".{_safe(job)}.{_safe(actor)}"
    try:
        candidates = [p for p in base.iterdir() if p.name.startswith(PREFIX) and p.name.endswith(name)]
    except FileNotFoundError:
        return []
    owner = {"job": job, "run": run, "actor": actor, "node": node}
    found = [
        p
        for p in candidates
        if (pid := owner_pid(p)) is not None and pid != os.getpid() and _owner(p) == owner
    ]
    return sorted(found, key=lambda p: p.stat().st_mtime if p.exists() else 0.0, reverse=True)


def _wait_gone(pids: list[int], wait_s: float) -> bool:
    deadline = time.monotonic() + wait_s
    while any(_alive(pid) for pid in pids):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def create(job: str, actor: str, run: str = "", node: str = "", adopt: bool = True) -> Path:
    """This agent's folder: its dead predecessor's (same job, run, actor and Ray node), adopted,
    when one is there and its processes are gone; else a new empty one."""
    sweep_stale()
    folder = root() / f"{PREFIX}{os.getpid()}.{_safe(job)}.{_safe(actor)}"
    shutil.rmtree(folder, ignore_errors=True)
    for old in adoptable(job, actor, run, node) if adopt else []:
        pids = [p for p in (owner_pid(old), _trainer_pid(old)) if p is not None]
        if not _wait_gone(pids, ADOPT_WAIT_S):
            logger.warning("not adopting %s: its agent or training process still runs", old)
            continue
        try:
            os.rename(old, folder)  # atomic: the reaper or a sweep may race for it
        except OSError:
            continue
        (folder / TRAINER_FILE).unlink(missing_ok=True)
        note = {"from": old.name, "agent_pid": owner_pid(old), "at": time.time()}
        (folder / ADOPTED_FILE).write_text(json.dumps(note))
        logger.info("adopted the checkpoint slots of this actor's previous agent: %s", old)
        return folder
    folder.mkdir(mode=0o700, parents=True)
    (folder / OWNER_FILE).write_text(json.dumps({"job": job, "run": run, "actor": actor, "node": node}))
    return folder


def note_trainer(folder: Path, pid: int) -> None:
    """Record the training process writing the slots (an adopter waits until it is gone)."""
    tmp = folder / f".{TRAINER_FILE}.tmp"
    with contextlib.suppress(OSError):
        tmp.write_text(str(pid))
        tmp.replace(folder / TRAINER_FILE)


def remove(folder: Path) -> None:
    shutil.rmtree(folder, ignore_errors=True)


# The reaper: a tiny detached process (forked twice, so Ray's clean-up of the actor's children
# does not take it along) holding the read end of a pipe whose write end only the agent has.
# When the agent ends in any way (a stop, the SIGKILL of a job's clean-up, a crash), the pipe
# reads EOF. An agent that stopped said so first (`end_reaper`: it removed the folder itself, and
# the reaper ends without touching a thing); otherwise the reaper keeps the folder for the grace (a shared lock on LOCK_FILE tells sweeps
# so), then removes it unless an adopter renamed it away: /dev/shm keeps nothing of a job.
_REAPER = """
import fcntl, os, shutil, sys, time
folder, grace = sys.argv[1], float(sys.argv[2])
# the lock is taken before the fork, so it is held once start_reaper returns (the child shares
# the locked open file): an agent killed right after its start leaves a folder its reaper keeps
lock = os.open(os.path.join(folder, ".reaper.lock"), os.O_RDONLY | os.O_CREAT, 0o600)
fcntl.flock(lock, fcntl.LOCK_SH)
if os.fork():
    os._exit(0)
os.setsid()
said = b""
while True:
    chunk = os.read(0, 65536)
    if not chunk:
        break
    said += chunk
if b"stopped" in said:
    sys.exit(0)  # the agent removed its folder: a folder of that name now is someone else's
time.sleep(grace)
doomed = os.path.join(os.path.dirname(folder), ".gone.%d.%s" % (os.getpid(), os.path.basename(folder)))
try:
    os.rename(folder, doomed)
except OSError:
    sys.exit(0)
shutil.rmtree(doomed, ignore_errors=True)
"""


def end_reaper(write_end: int) -> None:
    """The agent stopped and removed its folder: its reaper ends at once, with no grace."""
    with contextlib.suppress(OSError):
        os.write(write_end, b"stopped")
    os.close(write_end)


def start_reaper(folder: Path, grace: float | None = None) -> int:
    """Start the reaper of `folder`; returns the pipe's write end (keep it open: `end_reaper`
    when the agent stops; a dead agent's closes alone, and the folder waits `grace` seconds
    for an adopter)."""
    read_end, write_end = os.pipe()
    try:
        proc = subprocess.Popen(
            [sys.executable, "-c", _REAPER, str(folder), str(grace_s() if grace is None else grace)],
            stdin=read_end,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            close_fds=True,
        )
        proc.wait()  # the intermediate exits once the lock is held; its child reaps
    finally:
        os.close(read_end)
    return write_end
