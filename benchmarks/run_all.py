"""Run every benchmark and print one table: figure, value, budget, within budget or not.

Each benchmark runs as a subprocess of this script, exactly as it runs alone, and is read
through the FIGURE lines it prints last (`benchmarks/figures.py`). Benchmarks run one after the
other (they time themselves; running them side by side would make every figure noisier).

To add one, append a `Bench` to BENCHMARKS. A listed script that does not exist yet (such as
`failover.py`) is reported as missing and skipped; a benchmark that fails or times out is
reported with its last output lines and the others still run.

Usage: `uv run python benchmarks/run_all.py [--quick] [--long] [--only NAME ...] [--json PATH]`.
`--quick` leaves out the benchmarks that start Ray (and runs the others' quick variants);
`--long` adds the 30-minute chaos campaign (DESIGN section 9), left out by default.
Exit status: 0 when every figure with a budget is within it, 1 otherwise, 2 when a benchmark
failed.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from figures import Figure, parse

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent


@dataclass(frozen=True)
class Bench:
    """One benchmark script: `args` for a full run, `quick_args` for `--quick` (None: skipped)."""

    script: str
    args: tuple[str, ...] = ()
    quick_args: tuple[str, ...] | None = ()
    uses_ray: bool = False
    timeout_s: float = 600.0
    long: bool = False  # runs only with --long (a campaign of half an hour)


BENCHMARKS: tuple[Bench, ...] = (
    Bench("controller_scale.py"),
    Bench("rendezvous_scale.py", quick_args=("1000", "10000")),
    Bench("node_check_plan.py"),
    Bench("state_store.py", quick_args=("--stores", "memory,redis", "--rounds", "100")),
    Bench("inplace_restart.py", quick_args=("3",)),
    # flash checkpoints: save / plain copy (<= 1.5x); the full run adds the reference job's lost steps
    Bench("flash_checkpoint.py", quick_args=("--no-job", "--sizes-mib", "256"), uses_ray=True),
    Bench("goodput.py"),
    Bench("submit_latency.py", quick_args=None, uses_ray=True),
    Bench("failover.py", quick_args=None, uses_ray=True, timeout_s=900.0),
    Bench("master_recovery.py", quick_args=None, uses_ray=True),
    Bench("job_e2e.py", quick_args=None, uses_ray=True, timeout_s=900.0),
    Bench("ray_boot.py", args=("3",), quick_args=None, uses_ray=True),
    # the Cluster: 3 nodes x 2 ranks (nnodes 2:3), shrinking to 2 and growing back
    Bench("elastic_resize.py", args=("--nodes", "3", "--nproc", "2"), quick_args=None, uses_ray=True),
    Bench("scale_simple.py", quick_args=None, uses_ray=True),
    Bench("local_status.py", quick_args=None, uses_ray=True),  # `dlu status` of a local job, no Ray
    Bench("soak.py", quick_args=None, uses_ray=True),
    Bench(
        "chaos.py",
        ("--minutes", "30", "--faults", "50", "--seed", "1"),
        quick_args=None,
        uses_ray=True,
        timeout_s=3600.0,
        long=True,
    ),
)


@dataclass
class Outcome:
    bench: str
    status: str  # "ok", "missing", "skipped", "failed", "timeout", "no figures"
    seconds: float = 0.0
    figures: list[Figure] = field(default_factory=list[Figure])
    detail: str = ""


def run_one(bench: Bench, quick: bool, long: bool = False) -> Outcome:
    path = HERE / bench.script
    if not path.exists():
        return Outcome(bench.script, "missing", detail="not written yet")
    if bench.long and not long:
        return Outcome(bench.script, "skipped", detail="runs with --long (about 35 min)")
    if quick and bench.quick_args is None:
        return Outcome(
            bench.script, "skipped", detail="--quick" + (" (starts Ray)" if bench.uses_ray else "")
        )
    args = bench.quick_args if quick and bench.quick_args is not None else bench.args
    print(f"== {bench.script} {' '.join(args)}", flush=True)
    start = time.perf_counter()
    try:
        done = subprocess.run(
            [sys.executable, str(path), *args],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=bench.timeout_s,
        )
    except subprocess.TimeoutExpired as exc:
        out = exc.stdout if isinstance(exc.stdout, str) else (exc.stdout or b"").decode(errors="replace")
        return Outcome(bench.script, "timeout", bench.timeout_s, parse(out), f"over {bench.timeout_s:g} s")
    seconds = time.perf_counter() - start
    for line in done.stdout.splitlines():
        print(f"   {line}", flush=True)
    figures = parse(done.stdout)
    if done.returncode != 0:
        tail = " | ".join((done.stderr or done.stdout).strip().splitlines()[-3:])
        return Outcome(bench.script, "failed", seconds, figures, f"exit {done.returncode}: {tail}")
    if not figures:
        return Outcome(bench.script, "no figures", seconds, detail="printed no FIGURE line")
    return Outcome(bench.script, "ok", seconds, figures)


def verdict(fig: Figure) -> str:
    within = fig.within
    return "-" if within is None else ("within" if within else "OVER")


def table(outcomes: list[Outcome]) -> str:
    rows: list[tuple[str, str, str, str]] = [("figure", "value", "budget", "verdict")]
    for outcome in outcomes:
        for fig in outcome.figures:
            budget = "-" if fig.budget is None else f"<= {fig.budget:g} {fig.unit}"
            rows.append((fig.label, f"{fig.value:.4g} {fig.unit}", budget, verdict(fig)))
        if outcome.status != "ok":
            rows.append((outcome.bench, outcome.status, "-", outcome.detail[:100]))
    widths = [max(len(row[i]) for row in rows) for i in range(4)]
    lines = ["  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)) for row in rows]
    lines.insert(1, "  ".join("-" * width for width in widths))
    return "\n".join(line.rstrip() for line in lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="leave out the benchmarks that start Ray")
    parser.add_argument("--long", action="store_true", help="also run the 30-minute chaos campaign")
    parser.add_argument("--only", nargs="*", default=None, help="script names (with or without .py)")
    parser.add_argument("--json", default=None, help="also write the outcomes to this file")
    args = parser.parse_args()
    chosen = list(BENCHMARKS)
    if args.only:
        wanted = {name.removesuffix(".py") for name in args.only}
        chosen = [b for b in BENCHMARKS if b.script.removesuffix(".py") in wanted]
        unknown = wanted - {b.script.removesuffix(".py") for b in chosen}
        if unknown:
            parser.error(f"unknown benchmark(s): {', '.join(sorted(unknown))}")
    outcomes = [run_one(bench, args.quick, args.long) for bench in chosen]
    print()
    print(table(outcomes))
    if args.json:
        Path(args.json).write_text(
            json.dumps([{**asdict(o), "figures": [asdict(f) for f in o.figures]} for o in outcomes], indent=2)
        )
    if any(o.status in ("failed", "timeout", "no figures") for o in outcomes):
        return 2
    return 1 if any(f.within is False for o in outcomes for f in o.figures) else 0


if __name__ == "__main__":
    sys.exit(main())
