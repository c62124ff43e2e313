"""What the Ray-worker zygote buys: `job_e2e.py`'s run (60 steps, one crash, `dlu run` start to
exit, cold) with the zygote on and off (`DLU_RAY_WORKER_ZYGOTE=0`), interleaved so that the
machine's load falls on both alike. Prints each run, the medians of the whole run and of
"submitted -> RUNNING" (where the actors' worker starts fall), and FIGURE lines.

Usage: `uv run python benchmarks/ray_worker_zygote.py [rounds]` (default 3: 6 runs).
"""

from __future__ import annotations

import argparse
import os
import statistics

from figures import compile_workspace, figure
from job_e2e import Run, one_run

MODES = (("on", "1"), ("off", "0"))


def main(rounds: int) -> None:
    compile_workspace()
    runs: dict[str, list[Run]] = {mode: [] for mode, _ in MODES}
    for index in range(rounds):
        for mode, value in MODES if index % 2 == 0 else reversed(MODES):
            os.environ["DLU_RAY_WORKER_ZYGOTE"] = value
            run = one_run(index * 2 + (mode == "off"), None)
            runs[mode].append(run)
            start = run.phase("submitted", "running")
            print(
                f"round {index} zygote {mode:>3}: start -> exit {run.seconds:.2f} s, "
                f"submitted -> RUNNING {start if start is None else round(start, 2)} s",
                flush=True,
            )
    medians: dict[str, tuple[float, float]] = {}
    for mode, done in runs.items():
        total = statistics.median(r.seconds for r in done)
        starts = [v for r in done if (v := r.phase("submitted", "running")) is not None]
        medians[mode] = (total, statistics.median(starts) if starts else float("nan"))
        print(
            f"zygote {mode:>3}: start -> exit median {total:.2f} s, submitted -> RUNNING median {medians[mode][1]:.2f} s"
        )
    print(f"load average {os.getloadavg()[0]:.1f}")
    for mode, (total, start) in medians.items():
        figure(
            f"ray_worker_zygote_{mode}_e2e",
            total,
            "s",
            None,
            f"60-step job, one crash, Ray-worker zygote {mode}",
        )
        figure(
            f"ray_worker_zygote_{mode}_start",
            start,
            "s",
            None,
            f"submitted -> RUNNING, Ray-worker zygote {mode}",
        )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("rounds", type=int, nargs="?", default=3)
    main(parser.parse_args().rounds)
