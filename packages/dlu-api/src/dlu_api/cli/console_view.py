"""Drawing a `ConsoleState` with rich: the live view of `dlu run` in a terminal. Only layout
lives here; what to show is decided in `console_model`."""

from __future__ import annotations

import time

from rich import box
from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from dlu_api.cli.console_model import ConsoleState, Incident, RoleRow
from dlu_api.cli.render import one_line

STAGE_STYLES = {
    "PENDING": "yellow",
    "INIT": "yellow",
    "READY": "yellow",
    "RUNNING": "green",
    "STOPPING": "yellow",
    "STOPPED": "bold",
    "LOST": "bold red",
}


def _clock(t: float) -> str:
    return time.strftime("%H:%M:%S", time.localtime(t))


def header(state: ConsoleState) -> Text:
    text = Text.assemble(("job ", "dim"), (state.job, "bold"), "  ")
    text.append(state.stage, STAGE_STYLES.get(state.stage, ""))
    if state.exit_code is not None:
        text.append(f" (exit code {state.exit_code})", "green" if state.exit_code == 0 else "red")
    if state.elapsed_s is not None:
        text.append(f"  {state.elapsed_s:.0f}s", "dim")
    text.append(f"  {state.event_count} event(s)", "dim")
    return text


def _actors(row: RoleRow) -> str:
    text = ", ".join(f"{n} {stage}" for stage, n in row.states) or "no actors"
    if row.size and row.size != sum(n for _, n in row.states):
        text += f" (size {row.size})"  # being resized
    if row.sub_master is not None:
        text += " + SubMaster" if row.sub_master == "RUNNING" else f" + SubMaster {row.sub_master}"
    return text


def _restarts(row: RoleRow) -> str:
    parts = [f"{row.inplace_restarts} in place"] if row.inplace_restarts else []
    parts += [f"{row.restarts} role"] if row.restarts else []
    parts += [f"{row.resizes} resize(s)"] if row.resizes else []
    return ", ".join(parts) or "-"


def roles_table(state: ConsoleState) -> Table:
    table = Table(expand=False, show_edge=False, pad_edge=False, header_style="bold", box=box.SIMPLE_HEAD)
    table.add_column("role", no_wrap=True)
    table.add_column("actors", no_wrap=True)
    for column in ("step", "steps/s", "metric"):
        table.add_column(column, justify="right", no_wrap=True)
    table.add_column("restarts", no_wrap=True)
    for row in state.roles:
        table.add_row(
            Text.assemble(row.name, (f" {row.kind}", "dim")),
            _actors(row),
            "-" if row.step is None else str(row.step),
            "-" if row.steps_per_s is None else f"{row.steps_per_s:.1f}",
            "-" if row.metric is None else f"{row.metric:.4g}",
            _restarts(row),
        )
    return table


def restarts_line(state: ConsoleState) -> Text:
    if not state.restarts:
        return Text("restarts: none", "dim")
    return Text("restarts: " + ", ".join(f"{tier} {n}" for tier, n in state.restarts), "yellow")


def short_actor(name: str | None, job: str) -> str | None:
    """`trainer.1` for `job.trainer.1`: the job's name is on the screen already."""
    return name[len(job) + 1 :] if name and name.startswith(job + ".") else name


def _recovery(incident: Incident, finished: bool) -> Text:
    if incident.recovered_by is None:
        return Text("not recovered" if finished else "recovering ...", "red" if finished else "yellow")
    tier = f" ({incident.tier} tier)" if incident.tier else ""
    took = f" in {incident.duration_s:.2f}s" if incident.duration_s is not None else ""
    return Text(f"recovered{took}{tier}", "green")


def incident_lines(state: ConsoleState) -> list[Text]:
    """Two lines per failure: when, where, what and its recovery; then its message, cut to one line."""
    lines: list[Text] = []
    for incident in state.incidents:
        role, _, actor = incident.where.partition("/")
        where = short_actor(actor, state.job) or role or "job"
        head = Text(f"  {_clock(incident.time)} ", "dim")
        head.append(f"{where} ", "bold")
        head.append(f"{incident.kind}  ", "red")
        head.append_text(_recovery(incident, state.finished))
        lines += [head, Text(f"           {one_line(incident.message)}", no_wrap=True, overflow="ellipsis")]
    return lines


def render(state: ConsoleState, tracebacks: bool = True) -> RenderableType:
    """The whole screen: header, roles, restarts, root cause, failures, recent events. A
    failure's traceback shows once, in the root cause (`tracebacks` False: not at all)."""
    parts: list[RenderableType] = [header(state)]
    if state.reason and state.finished:
        parts.append(Text(f"reason: {one_line(state.reason)}"))
    if state.roles:
        parts += [Text(""), roles_table(state)]
    parts += [Text(""), restarts_line(state)]
    if state.stalled is not None:  # wrapped in full: it says what waits on what
        parts.append(Text(f"stalled: {state.stalled}", "yellow"))
    if state.first_failure is not None:
        e = state.first_failure
        who = short_actor(e.actor, state.job) or e.role or "the job"
        node = f" on node {e.node_id[:12]}" if e.node_id else ""
        message = e.message if tracebacks else one_line(e.message)
        parts.append(Text(f"root cause: {who}{node} ({e.kind}): {message}", "red"))
    if state.incidents:
        shown = len(state.incidents)
        more = f" (last {shown} of {state.incident_count})" if state.incident_count > shown else ""
        parts += [Text(""), Text(f"failures and recoveries{more}:", "bold"), *incident_lines(state)]
    if state.recent and not state.finished:
        parts += [Text(""), Text("latest events:", "bold")]
        for e in state.recent:
            where = short_actor(e.actor, state.job) or e.role
            line = Text(f"  {_clock(e.time)} ", "dim", no_wrap=True, overflow="ellipsis")
            line.append(f"{e.kind:<16} ", "cyan")
            line.append(f"{where + ': ' if where else ''}{one_line(e.message)}")
            parts.append(line)
    return Group(*parts)
