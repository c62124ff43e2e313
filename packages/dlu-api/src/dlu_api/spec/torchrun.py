"""Parse a torchrun command line into what DLU needs: nodes, processes per node, and the script.

DLU does its own rendezvous, so torchrun's rendezvous and master flags are accepted and ignored;
`--log-dir`, `--redirects` (`-r`) and `--tee` (`-t`) become the spec's `logs` settings and
`--local-ranks-filter` picks the ranks whose output is shown. `--start-method` is checked as
torchrun checks it, then ignored: DLU forks every rank from a zygote. Where DLU differs from
torchrun on purpose, `differences()` says so (printed at start, listed in docs/torchrun.md).
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field
from pathlib import PurePosixPath

from dlu_api.rank_logs import parse_modes
from dlu_api.spec.entrypoint import is_torchrun_command, split_command

MAX_NODES = 10_000  # the most nodes a job or an elastic role may ask for
_DIGITS = re.compile(r"[0-9]{1,6}")

# torchrun flags DLU accepts and ignores: it does its own rendezvous, monitoring and placement.
_IGNORED_VALUE_FLAGS = frozenset(
    {
        "monitor-interval",
        "rdzv-backend",
        "rdzv-endpoint",
        "rdzv-id",
        "rdzv-conf",
        "node-rank",
        "master-addr",
        "master-port",
        "local-addr",
        "role",
        "start-method",
        "logs-specs",
    }
)
_IGNORED_BOOL_FLAGS = frozenset({"standalone", "run-path"})
# Flags that take a value. Both spellings (dash and underscore) are accepted.
_LOG_FLAGS = frozenset({"log-dir", "redirects", "tee", "local-ranks-filter"})
START_METHODS = ("spawn", "fork", "forkserver")  # torchrun's choices
_VALUE_FLAGS = frozenset({"nnodes", "nproc-per-node", "max-restarts"}) | _LOG_FLAGS | _IGNORED_VALUE_FLAGS
_SHORT_FLAGS = {"-r": "redirects", "-t": "tee"}
_BOOL_FLAGS = frozenset({"module", "no-python"}) | _IGNORED_BOOL_FLAGS
_IGNORED = _IGNORED_VALUE_FLAGS | _IGNORED_BOOL_FLAGS


@dataclass(frozen=True)
class TorchrunCommand:
    """What a torchrun command asks for. `nproc_per_node` may be "gpu", "cpu" or "auto"."""

    min_nodes: int
    max_nodes: int
    nproc_per_node: int | str
    entrypoint: str
    max_restarts: int | None = None
    ignored_flags: tuple[str, ...] = field(default=())
    log_dir: str | None = None
    redirects: str | None = None  # torchrun's stream modes, checked (see dlu_api.rank_logs)
    tee: str | None = None
    local_ranks_filter: tuple[int, ...] | None = None  # local ranks shown on the console

    @property
    def nnodes(self) -> str:
        if self.min_nodes == self.max_nodes:
            return str(self.max_nodes)
        return f"{self.min_nodes}:{self.max_nodes}"


def parse_nnodes(value: str) -> tuple[int, int]:
    """ "2" -> (2, 2); "1:4" -> (1, 4).

    Raises:
        ValueError: not N or MIN:MAX with 1 <= MIN <= MAX.
    """
    parts = value.split(":")
    if not all(_DIGITS.fullmatch(p) for p in parts):  # int() would take '1_0' and '٣'
        raise ValueError(f"--nnodes {value!a} is not N or MIN:MAX in the digits 0-9")
    numbers = [int(p) for p in parts]
    if len(numbers) == 1:
        numbers = numbers * 2
    if len(numbers) != 2 or numbers[0] < 1 or numbers[0] > numbers[1]:
        raise ValueError(f"--nnodes {value!r} must be N or MIN:MAX with 1 <= MIN <= MAX")
    if numbers[1] > MAX_NODES:
        raise ValueError(f"--nnodes {value!r} asks for more than {MAX_NODES} nodes")
    return numbers[0], numbers[1]


def _split_flag(token: str) -> tuple[str, str | None]:
    body = token.lstrip("-")
    name, sep, value = body.partition("=")
    return name.replace("_", "-"), (value if sep else None)


def parse_torchrun(command: str | list[str]) -> TorchrunCommand:
    """Parse `torchrun [flags] script.py args...` (or `-m module args...`).

    Script arguments are kept verbatim, quoted again so that they split back the same.

    Raises:
        ValueError: not a torchrun command, an unknown flag, a missing value or script.
    """
    tokens = split_command(command) if isinstance(command, str) else list(command)
    if not is_torchrun_command(tokens):
        raise ValueError(
            f"not a torchrun command: {' '.join(tokens)!r}; start it with 'torchrun' "
            "or 'python -m torch.distributed.run'"
        )
    rest = tokens[1:] if tokens[0] == "torchrun" else tokens[3:]
    values: dict[str, str] = {}
    flags: set[str] = set()
    i = 0
    while i < len(rest) and rest[i].startswith("-") and rest[i] != "--":
        token = rest[i]
        if token == "-m":
            flags.add("module")
            i += 1
            continue
        name, inline = _split_flag(token)
        if token.partition("=")[0] in _SHORT_FLAGS:
            name = _SHORT_FLAGS[token.partition("=")[0]]
        if name in _BOOL_FLAGS:
            flags.add(name)
            i += 1
        elif name in _VALUE_FLAGS:
            if inline is None:
                if i + 1 >= len(rest):
                    raise ValueError(f"torchrun flag {token} needs a value")
                inline = rest[i + 1]
                i += 2
            else:
                i += 1
            values[name] = inline
        else:
            raise ValueError(
                f"unknown torchrun flag {token!r}; DLU understands --nnodes, --nproc-per-node, "
                "--max-restarts, --log-dir, --redirects, --tee, --local-ranks-filter, --standalone, "
                "-m/--module, --no-python and ignores rendezvous flags"
            )
    if i < len(rest) and rest[i] == "--":
        i += 1
    program = rest[i:]
    if not program:
        raise ValueError("torchrun command has no training script; add e.g. 'train.py'")

    if "standalone" in flags:
        min_nodes = max_nodes = 1
    else:
        min_nodes, max_nodes = parse_nnodes(values.get("nnodes", "1"))
    nproc_raw = values.get("nproc-per-node", "1")
    nproc: int | str
    if nproc_raw in ("gpu", "cpu", "auto"):
        nproc = nproc_raw
    else:
        try:
            nproc = int(nproc_raw)
        except ValueError:
            raise ValueError(
                f"--nproc-per-node {nproc_raw!r} is not a number, 'gpu', 'cpu' or 'auto'"
            ) from None
        if nproc < 1:
            raise ValueError(f"--nproc-per-node must be >= 1, got {nproc}")
    max_restarts: int | None = None
    if "max-restarts" in values:
        try:
            max_restarts = int(values["max-restarts"])
        except ValueError:
            raise ValueError(f"--max-restarts {values['max-restarts']!r} is not a number") from None

    script_args = [shlex.quote(a) for a in program[1:]]
    if "module" in flags:
        entrypoint = " ".join(["-m", program[0], *script_args])
    elif "no-python" in flags:
        raise ValueError(
            "--no-python runs a non-Python program; DLU runs Python training code. "
            "Drop --no-python and point torchrun at the Python script"
        )
    else:
        entrypoint = " ".join([shlex.quote(program[0]), *script_args])
    for stream_flag in ("redirects", "tee"):
        if stream_flag in values:
            parse_modes(values[stream_flag], f"--{stream_flag}")
    if values.get("start-method", "spawn") not in START_METHODS:
        raise ValueError(
            f"--start-method {values['start-method']!r} is not one of {', '.join(START_METHODS)}; "
            "drop it (DLU forks every rank from a zygote whatever it says)"
        )
    ranks_filter = _ranks_filter(values["local-ranks-filter"]) if "local-ranks-filter" in values else None
    if ranks_filter is not None and isinstance(nproc, int) and max(ranks_filter) >= nproc:
        raise ValueError(
            f"--local-ranks-filter names local rank {max(ranks_filter)}, but --nproc-per-node is "
            f"{nproc}; name local ranks 0 to {nproc - 1}"
        )
    if "log-dir" in values and not values["log-dir"].strip():
        raise ValueError("--log-dir is empty; give a directory, e.g. --log-dir /tmp/logs")
    ignored = tuple(sorted(n for n in (set(values) | flags) if n in _IGNORED))
    return TorchrunCommand(
        min_nodes,
        max_nodes,
        nproc,
        entrypoint,
        max_restarts,
        ignored,
        log_dir=values.get("log-dir"),
        redirects=values.get("redirects"),
        tee=values.get("tee"),
        local_ranks_filter=ranks_filter,
    )


def _ranks_filter(value: str) -> tuple[int, ...]:
    """torchrun's `--local-ranks-filter 0,2`: the local ranks whose output the console shows."""
    try:
        ranks = tuple(sorted({int(part) for part in value.split(",")}))
    except ValueError:
        raise ValueError(
            f"--local-ranks-filter {value!r} is not a comma-separated list of local ranks, e.g. 0,1"
        ) from None
    if not ranks or ranks[0] < 0:
        raise ValueError(f"--local-ranks-filter {value!r} must list local ranks >= 0, e.g. 0,1")
    return ranks


def default_job_name(cmd: TorchrunCommand, unique: str) -> str:
    """A job name for a torchrun command given no `--name`: the script's (or module's) name and
    `unique`, so that two torchrun jobs on one machine or cluster do not collide."""
    target = split_command(cmd.entrypoint)
    if target[0] == "-m" and len(target) > 1:
        stem = target[1].rsplit(".", 1)[-1].lower()  # a module: its last part
    else:
        stem = PurePosixPath(target[0]).stem.lower()
    stem = re.sub(r"[^a-z0-9]+", "-", stem).strip("-")[:40].strip("-") or "torchrun"
    return f"{stem}-{unique}"


def differences(cmd: TorchrunCommand, default_max_restarts: int) -> list[str]:
    """What this command does differently under DLU than under torchrun, on purpose: one line
    each, printed when the job starts (docs/torchrun.md explains them)."""
    notes: list[str] = []
    if cmd.max_restarts is None:
        notes.append(
            f"no --max-restarts: DLU restarts failed ranks up to {default_max_restarts} times "
            "(torchrun's default is 0); pass --max-restarts=0 for torchrun's behaviour"
        )
    return notes
