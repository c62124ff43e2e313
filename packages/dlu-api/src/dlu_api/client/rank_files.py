"""Reading rank log files on this machine: `dlu logs` of a local job, and `dlu run`'s tee.

Each file is read from the offset reached so far, never again from the start; lines come out
prefixed with their rank (`[trainer/rank1]`, `[trainer/rank1:err]` for stderr).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from dlu_api.errors import DLUError
from dlu_api.rank_logs import (
    HOME_SUBDIR,
    LineSplitter,
    RankFile,
    expand_dir,
    parse_rank_file,
    run_dir,
    select,
)
from dlu_api.status import JobStatus

POLL_S = 0.3
CHUNK = 1 << 20
HOME_ENV = "DLU_HOME"


def local_run_dir(status: JobStatus) -> Path:
    """Where a local job's run wrote its rank logs.

    Raises:
        DLUError: the status names no run yet (the job has not started one).
    """
    if not status.run_id:
        raise DLUError(
            f"job {status.name!r} has no rank logs yet: it has not started a run ({status.stage.value})"
        )
    root = expand_dir(status.log_dir) if status.log_dir else str(_home() / HOME_SUBDIR)
    return run_dir(root, status.name, status.run_id)


def _home() -> Path:
    return Path(os.environ.get(HOME_ENV) or Path.home() / ".dlu")


def selection_text(role: str | None, rank: int | None) -> str:
    parts = [f"role {role}" if role is not None else "", f"rank {rank}" if rank is not None else ""]
    chosen = " and ".join(p for p in parts if p)
    return f" for {chosen}" if chosen else ""


def check_selection(status: JobStatus, role: str | None, rank: int | None) -> None:
    """Refuse a role the job does not have, or a negative rank, naming what there is.

    Raises:
        DLUError: the message lists the job's roles.
    """
    names = [r.name for r in status.roles]
    if role is not None and names and role not in names:
        raise DLUError(f"job {status.name!r} has no role {role!r}; its roles: {', '.join(names)}")
    if rank is not None and rank < 0:
        raise DLUError(f"--rank {rank} is not a rank: give a whole number >= 0")


def rank_files(run_dir: Path) -> list[RankFile]:
    """Every rank log file of one run (`<run_dir>/<role>/rank<N>.<out|err>`)."""
    if not run_dir.is_dir():
        return []
    found = (parse_rank_file(str(p)) for p in run_dir.glob("*/rank*.*"))
    return [f for f in found if f is not None]


class FileTailer:
    """Reads what was appended to rank files since the last call, as prefixed whole lines.

    `wanted`: which files to read (e.g. only the tee'd streams); `prefix`: put the rank label
    before each line.
    """

    def __init__(
        self, run_dir: Path, wanted: Callable[[RankFile], bool] = lambda _: True, prefix: bool = True
    ):
        self.run_dir = run_dir
        self._wanted = wanted
        self._prefix = prefix
        self._offsets: dict[str, int] = {}
        self._splitters: dict[str, LineSplitter] = {}

    def _label(self, file: RankFile, line: str) -> str:
        return f"{file.label} {line}" if self._prefix else line

    def poll(self) -> Iterator[str]:
        """New complete lines of every wanted file (files that appeared since are read too),
        read in chunks: a large file is never held in memory whole."""
        for file in select([f for f in rank_files(self.run_dir) if self._wanted(f)], None, None):
            splitter = self._splitters.setdefault(file.path, LineSplitter())
            while data := self._read_new(file.path):
                yield from (self._label(file, line) for line in splitter.feed(data))

    def flush(self) -> Iterator[str]:
        """What `poll` finds, then each file's unfinished last line (the writer has ended)."""
        yield from self.poll()
        for path, splitter in sorted(self._splitters.items()):
            file = parse_rank_file(path)
            if file is not None:
                yield from (self._label(file, line) for line in splitter.flush())

    def _read_new(self, path: str) -> bytes:
        offset = self._offsets.get(path, 0)
        try:
            with open(path, "rb") as handle:
                handle.seek(offset)
                data = handle.read(CHUNK)
        except OSError:
            return b""
        self._offsets[path] = offset + len(data)
        return data


def read_rank_logs(
    run_dir: Path,
    role: str | None = None,
    rank: int | None = None,
    follow: Callable[[], bool] | None = None,
    poll_s: float = POLL_S,
) -> Iterator[str]:
    """The selected ranks' lines: file by file; with `follow` (a function saying whether the
    job still runs), new lines as they come, until the job has stopped and all is read."""

    def wanted(file: RankFile) -> bool:
        return (role is None or file.role == role) and (rank is None or file.rank == rank)

    tailer = FileTailer(run_dir, wanted)
    if follow is None:
        for file in select(rank_files(run_dir), role, rank):  # file by file, each to its end
            one = FileTailer(run_dir, lambda f, path=file.path: f.path == path)
            yield from one.flush()
        return
    while True:
        running = follow()
        yield from tailer.poll()
        if not running:
            yield from tailer.flush()
            return
        time.sleep(poll_s)
