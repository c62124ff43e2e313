"""A rank's stdout and stderr into its log files, at the file-descriptor level.

`dlu_api.rank_logs` says which streams go to files and where. Here the files are opened for
appending (a restarted rank adds below a marker line) and put on descriptors 1 and 2: of a
training process when the zygote forks it (`RankOutput`, used by `TrainingLauncher`), or of
the worker actor's own process for simple roles (`redirect_this_process`). Descriptors, not
`sys.stdout`: C-level output and child processes land in the file too.

A file that cannot be opened (a full or read-only disk) costs the rank its log, not its run:
one warning, and that stream stays on the actor's output.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from dlu_api.rank_logs import (
    HOME_SUBDIR,
    RAY_SUBDIR,
    STREAMS,
    RankStreams,
    expand_dir,
    rank_file,
    start_marker,
)

if TYPE_CHECKING:  # the training processes' zygote imports this module: no pydantic models for it
    from dlu_api.spec.models import LogsSettings

logger = logging.getLogger(__name__)

HOME_ENV = "DLU_HOME"  # as dlu_prime.job_files (not imported: that module pulls in the state layer)


def log_root(settings: LogsSettings) -> Path:
    """Where this node writes rank logs: the spec's dir; else the Ray session's log dir (so the
    dashboard can serve them); else $DLU_HOME/logs."""
    if settings.dir:
        return Path(expand_dir(settings.dir))
    from dlu_prime import ray_private

    session = ray_private.session_logs_dir()
    if session:
        return Path(session) / RAY_SUBDIR
    return Path(os.environ.get(HOME_ENV) or Path.home() / ".dlu") / HOME_SUBDIR


@dataclass(frozen=True)
class RankOutput:
    """The log files of one start of one rank. `paths`: stdout and/or stderr (by fd 1 or 2)."""

    paths: dict[int, str]
    marker: str

    @classmethod
    def of(
        cls,
        settings: LogsSettings,
        *,
        job: str,
        run_id: str,
        role: str,
        rank: int,
        attempt: str,
        root: Path | None = None,
    ) -> RankOutput | None:
        """None when the rank writes no file (redirects and tee both 0 for it)."""
        streams = RankStreams.of(settings.redirects, settings.tee, rank)
        if not streams.to_file:
            return None
        base = root if root is not None else log_root(settings)
        paths = {
            bit: str(rank_file(base, job, run_id, role, rank, suffix))
            for bit, suffix in STREAMS.items()
            if streams.writes(bit)
        }
        return cls(paths, start_marker(role, rank, attempt))

    def open(self) -> dict[int, int]:
        """Open each file for appending, the marker written first; {1 or 2: fd}. A file that
        cannot be opened is left out (with a warning)."""
        opened: dict[int, int] = {}
        for target, path in self.paths.items():
            try:
                Path(path).parent.mkdir(parents=True, exist_ok=True)
                fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)
            except OSError as exc:
                logger.warning(
                    "cannot open the rank log %s (%s); that stream stays on the actor's output", path, exc
                )
                continue
            with contextlib.suppress(OSError):
                os.write(fd, self.marker.encode())
            opened[target] = fd
        return opened


def fds_for_child(output: RankOutput | None) -> tuple[list[int], list[int]]:
    """(stdout fd, stderr fd) to hand a forked training process, and the fds to close after the
    fork. Without files: this process's own 1 and 2."""
    opened = output.open() if output is not None else {}
    return [opened.get(1, 1), opened.get(2, 2)], list(opened.values())


def redirect_this_process(output: RankOutput | None) -> list[str]:
    """Put this process's stdout/stderr on the rank's files; the paths now written."""
    if output is None:
        return []
    opened = output.open()
    for target, fd in opened.items():
        stream = sys.stdout if target == 1 else sys.stderr
        with contextlib.suppress(Exception):
            stream.flush()
        os.dup2(fd, target, inheritable=True)
        os.close(fd)
        with contextlib.suppress(Exception):
            cast(Any, stream).reconfigure(line_buffering=True)
    return [output.paths[t] for t in sorted(opened)]
