"""Process checks shared by the training-process and zygote tests."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path


def gone(pid: int) -> bool:
    """Whether `pid` has exited (a zombie still answers kill(0): its state is read)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    try:
        # Z: a zombie; X: being reaped right now (its parent's wait is under way)
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except OSError:
        return True


@dataclass(frozen=True)
class Proc:
    """One process, as /proc shows it; `start` (clock ticks after boot) tells a reused pid apart."""

    pid: int
    ppid: int
    start: int
    cmdline: str


def snapshot(pid: int) -> Proc | None:
    """The live process `pid` (None if it is gone or a zombie)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[1].split()  # after the command name, which may hold spaces
    if fields[0] == "Z":
        return None
    return Proc(pid, int(fields[1]), int(fields[19]), cmdline.strip())


def processes() -> dict[int, Proc]:
    """Every live process of this machine (zombies left out)."""
    table: dict[int, Proc] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            found = snapshot(int(entry.name))
            if found is not None:
                table[found.pid] = found
    return table


def descendants(table: dict[int, Proc], root: int) -> set[int]:
    """`root`'s children, their children, and so on (not `root` itself)."""
    children: dict[int, list[int]] = {}
    for proc in table.values():
        children.setdefault(proc.ppid, []).append(proc.pid)
    found: set[int] = set()
    todo = [root]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def still_alive(procs: list[Proc]) -> list[Proc]:
    """Those of `procs` that still run (the same processes: a reused pid does not count)."""
    alive: list[Proc] = []
    for proc in procs:
        now = snapshot(proc.pid)
        if now is not None and now.start == proc.start:
            alive.append(proc)
    return alive
