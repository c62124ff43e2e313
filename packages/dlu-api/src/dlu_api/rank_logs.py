"""Per-rank log files: which streams go where, and where the files are. Pure; both the workers
(which write the files) and the clients (which read them) use it.

Layout: `<root>/<job>/<run_id>/<role>/rank<N>.out` and `.err`. `root` is the spec's `logs.dir`;
a local job without one gets `$DLU_HOME/logs`, a cluster job `<Ray session log dir>/dlu` on each
node (so Ray's dashboard log API can serve the files to a driver with only dlu-api).

Stream modes follow torchrun's `--redirects` / `--tee`: 0 none, 1 stdout, 2 stderr, 3 both, or
per rank, `0:1,1:2` (ranks not named get 0).
"""

from __future__ import annotations

import os
import re
import time
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

NONE, STDOUT, STDERR, BOTH = 0, 1, 2, 3
STREAMS = {STDOUT: "out", STDERR: "err"}  # mode bit -> file suffix
RAY_SUBDIR = "dlu"  # under the Ray session's log dir
HOME_SUBDIR = "logs"  # under $DLU_HOME
MARKER_PREFIX = "==== dlu: "
_RANK_FILE = re.compile(r"^rank(\d+)\.(out|err)$")

StreamModes = int | dict[int, int]


def parse_modes(value: str | int, field: str) -> StreamModes:
    """'3' -> 3; '0:1,1:2' -> {0: 1, 1: 2}. `field` names the setting in errors.

    Raises:
        ValueError: not 0-3 nor RANK:MODE pairs; the message names `field` and the fix.
    """
    text = str(value).strip()
    fix = f"give {field} as 0 (none), 1 (stdout), 2 (stderr), 3 (both), or per rank, e.g. '0:3,1:2'"
    if re.fullmatch(r"[0-3]", text):
        return int(text)
    modes: dict[int, int] = {}
    for part in text.split(","):
        match = re.fullmatch(r"\s*(\d+)\s*:\s*([0-3])\s*", part)
        if match is None:
            raise ValueError(f"{field} {value!r} is not a stream mode: {fix}")
        rank = int(match.group(1))
        if rank in modes:
            raise ValueError(f"{field} {value!r} names rank {rank} twice: {fix}")
        modes[rank] = int(match.group(2))
    return modes


def mode_for(modes: StreamModes, rank: int) -> int:
    """The mode of one rank (a rank a per-rank mapping leaves out gets NONE)."""
    return modes.get(rank, NONE) if isinstance(modes, dict) else modes


def format_modes(modes: StreamModes) -> str:
    if isinstance(modes, int):
        return str(modes)
    return ",".join(f"{rank}:{mode}" for rank, mode in sorted(modes.items()))


def torchrun_tee(
    redirects: str | None,
    tee: str | None,
    world: int,
    local_ranks: tuple[int, ...] | None = None,
    nproc_per_node: int = 1,
) -> str:
    """What `dlu run` mirrors for a torchrun command: what torchrun leaves on its console.

    torchrun prints a stream unless `--redirects` sends it to a file only, and `--tee` prints
    it again; so its console shows (not redirected) | tee'd, per rank, and only for the local
    ranks `--local-ranks-filter` names (`local_ranks`; the files keep everything). DLU writes
    every stream to the rank files (`dlu logs` has them all) and mirrors exactly that on its
    terminal. `world`: the ranks a per-rank form is spelled out for (node-major: a rank's local
    rank is rank % `nproc_per_node`).
    """
    redirected = parse_modes(redirects or "0", "--redirects")
    mirrored = parse_modes(tee or "0", "--tee")
    if isinstance(redirected, int) and isinstance(mirrored, int) and local_ranks is None:
        return str((BOTH & ~redirected) | mirrored)
    per_rank = {
        r: (BOTH & ~mode_for(redirected, r)) | mode_for(mirrored, r)
        if local_ranks is None or r % max(1, nproc_per_node) in local_ranks
        else 0
        for r in range(world)
    }
    return format_modes(per_rank)


@dataclass(frozen=True)
class RankStreams:
    """What happens to one rank's stdout and stderr.

    `to_file`: streams written to the rank's files (what `redirects` or `tee` names); the others
    stay on the actor's own output (Ray's worker log). `tee`: streams `dlu run` also prints.
    """

    to_file: int
    tee: int

    @classmethod
    def of(cls, redirects: str | int, tee: str | int, rank: int) -> RankStreams:
        mirrored = mode_for(parse_modes(tee, "logs.tee"), rank)
        redirected = mode_for(parse_modes(redirects, "logs.redirects"), rank)
        return cls(to_file=redirected | mirrored, tee=mirrored)

    def writes(self, bit: int) -> bool:
        return bool(self.to_file & bit)


def run_dir(root: str | Path, job: str, run_id: str) -> Path:
    return Path(root) / job / (run_id or "no-run-id")


def rank_file(root: str | Path, job: str, run_id: str, role: str, rank: int, stream: str) -> Path:
    """`stream`: 'out' or 'err'."""
    return run_dir(root, job, run_id) / role / f"rank{rank}.{stream}"


def relative_rank_file(job: str, run_id: str, role: str, rank: int, stream: str) -> str:
    """The file's path under the Ray session's log dir (what the dashboard's log API takes)."""
    return str(PurePosixPath(RAY_SUBDIR, job, run_id or "no-run-id", role, f"rank{rank}.{stream}"))


@dataclass(frozen=True, order=True)
class RankFile:
    """One rank log file, as found by a reader. `path`: local path, or the name a remote API takes."""

    role: str
    rank: int
    stream: str
    path: str

    @property
    def label(self) -> str:
        suffix = "" if self.stream == "out" else ":err"
        return f"[{self.role}/rank{self.rank}{suffix}]"


def parse_rank_file(path: str) -> RankFile | None:
    """The role, rank and stream of a path ending `<role>/rank<N>.<out|err>`; None otherwise."""
    parts = PurePosixPath(path).parts
    if len(parts) < 2:
        return None
    match = _RANK_FILE.match(parts[-1])
    if match is None:
        return None
    return RankFile(parts[-2], int(match.group(1)), match.group(2), path)


def select(files: list[RankFile], role: str | None, rank: int | None) -> list[RankFile]:
    """The files of `role` and `rank` (None: any), in role, rank, out-before-err order."""
    chosen = [f for f in files if (role is None or f.role == role) and (rank is None or f.rank == rank)]
    return sorted(chosen, key=lambda f: (f.role, f.rank, f.stream != "out", f.path))


def start_marker(role: str, rank: int, attempt: str, at: float | None = None) -> str:
    """The line written at the top of each start of a rank (restarts append below)."""
    stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(time.time() if at is None else at))
    return f"{MARKER_PREFIX}{role}/rank{rank} started at {stamp} ({attempt}) ====\n"


def expand_dir(value: str) -> str:
    """A spec's `logs.dir` as the workers use it: `~` expanded."""
    return os.path.expanduser(value)


class LineSplitter:
    """Bytes read in pieces -> whole lines; a partial last line waits for its end (or `flush`)."""

    def __init__(self) -> None:
        self._pending = b""

    def feed(self, data: bytes) -> list[str]:
        self._pending += data
        *complete, self._pending = self._pending.split(b"\n")
        return [line.decode(errors="replace") for line in complete]

    def flush(self) -> list[str]:
        rest, self._pending = self._pending, b""
        return [rest.decode(errors="replace")] if rest else []
