"""Turning job statuses into lines for a terminal; pure functions plus one small stateful printer."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable

from dlu_api.cli.console_model import sub_master_stage, workers_of
from dlu_api.diagnosis import root_cause
from dlu_api.recovery import recovery_lines
from dlu_api.status import EventCursor, JobEvent, JobStatus, JobSummary, RoleStatus


def role_line(role: RoleStatus, with_step: bool = False) -> str:
    """The role's workers by stage (its SubMaster apart, and left out once they all finished)."""
    workers = workers_of(role)
    stages = Counter(a.stage for a in workers)
    stage_text = ", ".join(f"{n} {stage}" for stage, n in sorted(stages.items())) or "no actors"
    sub_master = sub_master_stage(role, workers)
    if sub_master is not None:
        stage_text += f" + SubMaster {sub_master}"
    restarts = f", {role.restart_count} restart(s)" if role.restart_count else ""
    if role.inplace_restart_count:
        restarts += f", {role.inplace_restart_count} in-place restart(s)"
    if role.sub_master_restart_count:
        restarts += f", {role.sub_master_restart_count} SubMaster restart(s)"
    steps = [a.step for a in workers if a.step is not None]
    step = f", step {max(steps)}" if with_step and steps else ""
    size = f"size {role.size}, " if role.size else ""
    resized = f", {role.resize_count} resize(s)" if role.resize_count else ""
    if role.nodes is not None and role.min_nodes is not None and role.max_nodes is not None:
        size = f"nodes {role.nodes} (min {role.min_nodes}, max {role.max_nodes}"
        size += f", {role.pending_nodes} pending), " if role.pending_nodes else "), "
    return f"  {role.name} ({role.kind}): {size}{stage_text}{restarts}{resized}{step}"


def one_line(text: str) -> str:
    """A message's first line: a failure's traceback is shown once, in the root cause, not in
    every event line and reason that quotes it."""
    head, more, rest = text.partition("\n")
    if not more:
        return head
    return head + (" (traceback elided)" if "Traceback (most recent call last)" in rest else " ...")


def event_line(event: JobEvent, t0: float | None = None) -> str:
    when = (
        f"+{event.time - t0:7.2f}s"
        if t0 is not None
        else time.strftime("%H:%M:%S", time.localtime(event.time))
    )
    where = "/".join(p for p in (event.role, event.actor) if p)
    return f"  {when} {event.kind:<18} {where + ': ' if where else ''}{one_line(event.message)}"


def stall_notice(status: JobStatus) -> str | None:
    """The PrimeMaster's "stalled" notice while it holds (no "progress_resumed" after it, the job
    still running), else None."""
    if status.stage.value != "RUNNING":
        return None
    for event in reversed(status.events):
        if event.kind == "progress_resumed":
            return None
        if event.kind == "stalled":
            return event.message
    return None


def _once(lines: list[str], tracebacks: bool) -> list[str]:
    """`lines` with only the first traceback kept (indented under its line), or none."""
    out: list[str] = []
    for line in lines:
        if tracebacks and "\n" in line:
            out.append(line.replace("\n", "\n    "))
            tracebacks = False
        else:
            out.append(one_line(line))
    return out


def status_text(status: JobStatus, events: int = 10, tracebacks: bool = True) -> str:
    """The status as lines. A failure's traceback shows once: in the root cause (or the reason,
    where there is none); with `tracebacks` False, nowhere (`dlu run` printed it already, from
    the rank's tee'd stderr)."""
    lines = [f"job {status.name}: {status.stage.value}"]
    if status.exit_code is not None:
        lines[0] += f" (exit code {status.exit_code})"
    cause_lines = _once(root_cause(status.events, status.first_failure).lines(), tracebacks)
    if status.reason:
        full = tracebacks and not any("\n" in line for line in cause_lines)
        lines.append(f"reason: {status.reason if full else one_line(status.reason)}")
    stalled = stall_notice(status)
    if stalled:
        lines.append(f"stalled: {stalled}")
    counters = [
        f"{label} {value}"
        for label, value in (
            ("job restarts", status.job_restart_count),
            ("global restarts", status.global_restart_count),
            ("PrimeMaster restarts", status.master_restart_count),
            ("node relaunches", status.node_restart_count),
        )
        if value
    ]
    if counters:
        lines.append("restarts: " + ", ".join(counters))
    if cause_lines:
        lines.append("root cause:")
        lines += ["  " + line for line in cause_lines]
    if status.roles:
        lines.append("roles:")
        lines += [role_line(r, with_step=True) for r in status.roles]
    stats = statistics_lines(status)
    if stats:
        lines.append("statistics:")
        lines += stats
    recovered = recovery_lines(status.events)
    if recovered:
        lines.append("recoveries:")
        lines += recovered
    if status.events and events:
        lines.append(f"last {min(events, len(status.events))} event(s):")
        lines += [event_line(e) for e in status.events[-events:]]
    return "\n".join(lines)


def statistics_lines(status: JobStatus) -> list[str]:
    """Runtime statistics: each role's speed per world size, each actor's CPU and memory, and the
    backlog of each data channel (only what was measured)."""
    lines: list[str] = []
    for role in status.roles:
        speeds = [
            f"{t.world_size}: "
            + ", ".join(
                part
                for part in (
                    f"{t.samples_per_s:.1f} samples/s" if t.samples_per_s is not None else "",
                    f"{t.steps_per_s:.2f} steps/s" if t.steps_per_s is not None else "",
                )
                if part
            )
            for t in status.throughput.get(role.name, [])
        ]
        if speeds:
            lines.append(f"  {role.name} speed by size: " + "; ".join(speeds))
        for actor in role.actors:
            use = [
                f"cpu {actor.cpu_percent:.0f}%" if actor.cpu_percent is not None else "",
                f"mem {actor.memory_bytes / 2**20:.0f} MiB" if actor.memory_bytes is not None else "",
                f"relaunched with {actor.memory_limit_bytes / 2**20:.0f} MiB"
                if actor.memory_limit_bytes is not None
                else "",
                f"gpu {actor.gpu_percent:.0f}%" if actor.gpu_percent is not None else "",
            ]
            if any(use):
                lines.append(f"  {actor.name}: " + ", ".join(u for u in use if u))
    lines += [f"  {line}" for line in status.free_bundles]
    if status.backlogs:
        lines.append("  backlog: " + ", ".join(f"{k} {v}" for k, v in sorted(status.backlogs.items())))
    if status.autoscale:
        lines.append(f"  autoscale: {status.autoscale}")
    return lines


class ProgressPrinter:
    """Prints what changed between successive statuses: stage, role states, new events."""

    def __init__(self, emit: Callable[[str], None]) -> None:
        self._emit = emit
        self._stage: str | None = None
        self._roles: dict[str, str] = {}
        self._cursor = EventCursor()
        self._t0: float | None = None

    def __call__(self, status: JobStatus) -> None:
        if status.events and self._t0 is None:
            self._t0 = status.events[0].time
        if status.stage.value != self._stage:
            self._stage = status.stage.value
            self._emit(f"[{status.name}] stage {status.stage.value}")
        for role in status.roles:
            line = role_line(role)
            if self._roles.get(role.name) != line:
                self._roles[role.name] = line
                self._emit(line)
        for event in self._cursor.take(status.events):
            self._emit(event_line(event, self._t0))


def _when(t: float | None) -> str:
    return "-" if t is None else time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t))


def jobs_table(jobs: list[JobSummary]) -> str:
    """`dlu list`: a header, then one aligned row per job; a line saying so when there are none."""
    if not jobs:
        return "no jobs"
    header = ("NAME", "STAGE", "EXIT", "STARTED", "ENDED", "WHERE")
    rows = [header] + [
        (
            j.name,
            j.stage.value,
            "-" if j.exit_code is None else str(j.exit_code),
            _when(j.start_time),
            _when(j.end_time),
            j.where,
        )
        for j in jobs
    ]
    widths = [max(len(row[i]) for row in rows) for i in range(len(header) - 1)]
    return "\n".join(
        "  ".join(cell.ljust(w) for cell, w in zip(row[:-1], widths, strict=True)) + "  " + row[-1]
        for row in rows
    )
