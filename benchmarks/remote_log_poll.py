"""What a remote driver pays to read a long-running job's launcher log.

A cluster job's launcher writes a DLU-STATUS line whenever the job's status changes, and at
most every 5 s (`DLU_STATUS_INTERVAL_S`) when only the ranks' steps moved: a day of a job is
17,280 of them. This builds such a log (N ranks, H hours, an event an hour) with the launcher's
own line format and prints, per size:

- the log's size: what one read of the whole log through the Jobs API moves;
- one parse of it as every poll once did it (every DLU-STATUS validated);
- one parse by `wire.parse_log` (only the latest DLU-STATUS validated);
- what a `LauncherFeed` reads per poll once it caught up: the lines appended since the last
  poll (one status line per interval at most), not the log.

Usage: `uv run python benchmarks/remote_log_poll.py [--ranks 4 64] [--hours 24 168]`.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

from figures import figure

from dlu_api.client import wire
from dlu_api.status import ActorStatus, JobEvent, JobStage, JobStatus, RoleStatus

STATUS_INTERVAL_S = 5.0


def launcher_log(ranks: int, hours: float) -> tuple[str, int]:
    """The log and the size of one status line of it."""
    lines = [wire.line(wire.ACCEPTED, {"name": "lm", wire.MAILBOX: True})]
    count = int(hours * 3600 / STATUS_INTERVAL_S)
    per_hour = int(3600 / STATUS_INTERVAL_S)
    line = ""
    for i in range(count):
        actors = [
            ActorStatus(
                name=f"lm.trainer.{r}",
                role="trainer",
                rank=r,
                stage="RUNNING",
                node_id="ab" * 28,
                step=i * 50,
            )
            for r in range(ranks)
        ]
        role = RoleStatus(name="trainer", kind="elastic", size=ranks, actors=actors)
        line = wire.status_line(JobStatus(name="lm", stage=JobStage.RUNNING, roles=[role]))
        lines.append(line)
        if i % per_hour == 0:
            event = JobEvent(
                time=float(i), kind="inplace_restart", message="rank failed", seq=i // per_hour + 1
            )
            lines.append(wire.event_line(event))
    return "\n".join(lines) + "\n", len(line) + 1


def every_status_parsed(text: str) -> JobStatus | None:
    """A poll as it was: each DLU-STATUS line validated, the last one kept."""
    status = None
    for raw in text.splitlines():
        tag, _, payload = raw.partition(" ")
        if tag == wire.STATUS:
            status = JobStatus.model_validate_json(payload)
    return status


def best_of(runs: int, call: Callable[[], object]) -> float:
    times: list[float] = []
    for _ in range(runs):
        t0 = time.perf_counter()
        call()
        times.append(time.perf_counter() - t0)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--ranks", type=int, nargs="+", default=[4, 64])
    parser.add_argument("--hours", type=float, nargs="+", default=[24.0])
    parser.add_argument("--runs", type=int, default=3, help="parses per figure; the best is printed")
    args = parser.parse_args()
    figures: list[tuple[str, float, str, str]] = []
    for ranks in args.ranks:
        for hours in args.hours:
            text, line_bytes = launcher_log(ranks, hours)
            old = best_of(args.runs, lambda t=text: every_status_parsed(t))
            new = best_of(args.runs, lambda t=text: wire.parse_log(t))
            assert wire.parse_log(text).status == every_status_parsed(text)
            print(
                f"{ranks:4d} ranks, {hours:5.0f} h: log {len(text) / 1e6:7.1f} MB; one parse, every "
                f"status validated {old:6.3f} s, the latest only {new:6.3f} s; a followed poll reads "
                f"<= {line_bytes} bytes per {STATUS_INTERVAL_S:g} s"
            )
            tag = f"{ranks}r_{hours:g}h"
            figures += [
                (f"remote_log_mb_{tag}", len(text) / 1e6, "MB", f"launcher log, {ranks} ranks, {hours:g} h"),
                (f"remote_parse_all_{tag}", old, "s", "one parse, every DLU-STATUS validated"),
                (f"remote_parse_latest_{tag}", new, "s", "one parse, the latest DLU-STATUS only"),
            ]
    for name, value, unit, label in figures:
        figure(name, value, unit, label=label)


if __name__ == "__main__":
    main()
