"""Fault injectors of the chaos campaign: each finds its victim and hits it, nothing more.

Processes are signalled by pid: a DLU actor's pid comes from its own status (the PrimeMaster's
from `ping`), a rank's training process from its ElasticWorker's status (`process_pid`).
Every training process the reference script started is in its pid log (`--pid-dir`:
`<dir>/<actor>.pids`, one "pid start-time" line each, the start time telling a reused pid
apart), which the leak check reads. Ray must be initialized in this process.
"""

from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class Proc:
    """A process as its pid log recorded it."""

    pid: int
    started: str  # /proc/<pid>/stat field 22, clock ticks since boot

    def state(self) -> str | None:
        """Its /proc state letter ('R', 'S', 'T' stopped, 'Z' zombie...), None once gone or
        once the pid belongs to another process."""
        try:
            fields = Path(f"/proc/{self.pid}/stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            return None
        if self.started != "0" and fields[19] != self.started:
            return None
        return fields[0]

    @property
    def alive(self) -> bool:
        """Running or stopped, not a zombie."""
        return self.state() not in (None, "Z", "X")


def logged_processes(pid_dir: Path, actor: str | None = None) -> list[Proc]:
    """Every process the pid logs in `pid_dir` recorded (of `actor`, or of all), oldest first."""
    files = [pid_dir / f"{actor}.pids"] if actor else sorted(pid_dir.glob("*.pids"))
    found: list[Proc] = []
    for path in files:
        try:
            lines = path.read_text().splitlines()
        except FileNotFoundError:
            continue
        for line in lines:
            parts = line.split()
            if len(parts) == 2 and parts[0].isdigit():
                found.append(Proc(int(parts[0]), parts[1]))
    return found


def start_time(pid: int) -> str:
    """/proc/<pid>/stat field 22 (clock ticks since boot), '0' if unreadable."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return "0"


def training_process(actor: str, timeout_s: float = 60.0) -> Proc:
    """The running training process of a rank, as its ElasticWorker reports it.

    Raises:
        TimeoutError: none within `timeout_s` (the rank is between processes for that long).
    """
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            pid = _status(actor, 10).get("process_pid")
        except Exception:
            pid = None
        if pid:
            proc = Proc(int(pid), start_time(int(pid)))
            if proc.state() in ("R", "S", "D"):
                return proc
        if time.monotonic() > deadline:
            raise TimeoutError(f"{actor} reported no running training process within {timeout_s:.0f} s")
        time.sleep(0.05)


def crash_process(proc: Proc) -> None:
    """A training process dies at once (as on an OOM kill or a segfault)."""
    os.kill(proc.pid, signal.SIGKILL)


def hang_process(proc: Proc) -> None:
    """A training process stops dead: no step, no heartbeat, its peers block in collectives."""
    os.kill(proc.pid, signal.SIGSTOP)


def _actor(name: str) -> Any:
    import ray

    from dlu_prime.naming import NAMESPACE

    return ray.get_actor(name, namespace=NAMESPACE)


def _status(name: str, timeout_s: float) -> dict[str, Any]:
    import ray

    found: dict[str, Any] = ray.get(_actor(name).status.remote(), timeout=timeout_s)
    return found


def actor_pid(name: str) -> int:
    """The pid of a DLU worker or SubMaster actor (from its status)."""
    return int(_status(name, 30)["pid"])


def master_pid(job: str) -> int:
    import ray

    from dlu_prime.naming import master_name

    found: dict[str, Any] = ray.get(_actor(master_name(job)).ping.remote(), timeout=30)
    return int(found["pid"])


def kill_pid(pid: int) -> None:
    """SIGKILL an actor's process: Ray reconstructs the actor (DLU's actors restart forever)."""
    os.kill(pid, signal.SIGKILL)


def actor_node(name: str) -> str | None:
    """The Ray node an actor runs on, None if it does not answer."""
    try:
        return _status(name, 10).get("node_id")
    except Exception:
        return None


def remove_node(cluster: Any, node_id: str, replace: bool, node_args: dict[str, Any]) -> str | None:
    """Remove a node of a `ray.cluster_utils.Cluster` (its raylet and everything on it die), and
    with `replace` add a fresh one with the same arguments, as a cloud replacing a dead machine
    would. Returns the new node's id.

    Raises:
        LookupError: no node with that id.
    """
    found = [n for n in cluster.list_all_nodes() if n.node_id == node_id]
    if not found:
        raise LookupError(f"no Ray node {node_id} in the cluster")
    cluster.remove_node(found[0], allow_graceful=False)
    if not replace:
        return None
    new = cluster.add_node(**node_args)
    cluster.wait_for_nodes()
    return str(new.node_id)
