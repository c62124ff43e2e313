"""How long each recovery took, read off a job's event timeline (pure; the CLI prints it).

A timeline holds failures ("died", "heartbeat_timeout", ...) and, later, the event that says a
recovery is complete ("actors_restarted", "failover_done"). Two ways to get a duration:

- the completion event carries `duration_s` (the PrimeManager measured it; it may also name the
  failover `tier`): that figure is used as is;
- otherwise the completion is paired with the earliest failure still open before it, of the
  same role (events without a role match any role), and the duration is the time between them.

One completion closes every failure open before it in its role: overlapping failures that one
restart fixed are one recovery, timed from the first. Failures never followed by a completion
are reported as not recovered (the job stopped on them, or is still recovering).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from dlu_api.status import JobEvent
from dlu_api.vocabulary import RECOVERED_EVENTS, RECOVERY_OPENERS


@dataclass(frozen=True)
class Recovery:
    """One failure and what became of it; `done` is None while it is not recovered."""

    failure: JobEvent
    done: JobEvent | None
    duration_s: float | None
    tier: str | None = None

    @property
    def recovered(self) -> bool:
        return self.done is not None


def _field(event: JobEvent, name: str) -> object:
    """An optional field a newer PrimeMaster may add to events (`duration_s`, `tier`)."""
    value = getattr(event, name, None)
    if value is None and event.model_extra:
        value = event.model_extra.get(name)
    return value


def _matches(failure: JobEvent, done: JobEvent) -> bool:
    return failure.role is None or done.role is None or failure.role == done.role


FAILOVER_STARTS = frozenset({"failover_started", "failover_escalated"})
FAILOVER_ENDS = frozenset({"failover_done", "failover_failed", "recovered"})
"""Events that open and end a failover (every failover of the job ends with one of the latter)."""


def recoveries(events: Iterable[JobEvent]) -> list[Recovery]:
    """Every failure of the timeline paired with its recovery, in timeline order.

    While a failover is open, the actors it replaces (`actors_restarted`) are one of its steps,
    not a recovery of their own: its `failover_done` completes it (else one fault showed as two
    recoveries, the second `failover_done -> failover_done`)."""
    open_failures: list[JobEvent] = []
    failovers: list[JobEvent] = []  # failover_started events not yet ended
    found: list[Recovery] = []
    for event in events:
        if event.kind in FAILOVER_ENDS:
            failovers = [f for f in failovers if not _matches(f, event)]
        elif event.kind in FAILOVER_STARTS:
            failovers.append(event)
        if event.kind in RECOVERY_OPENERS:
            open_failures.append(event)
            continue
        if event.kind not in RECOVERED_EVENTS:
            continue
        if event.kind == "actors_restarted" and any(_matches(f, event) for f in failovers):
            continue
        closed = [f for f in open_failures if _matches(f, event)]
        duration = _field(event, "duration_s")
        tier = _field(event, "tier")
        first = closed[0] if closed else None
        if isinstance(duration, int | float):
            seconds: float | None = float(duration)
        else:
            seconds = event.time - first.time if first is not None else None
        if first is None and seconds is None:
            continue  # a completion with nothing to pair and no figure of its own
        found.append(Recovery(first or event, event, seconds, tier if isinstance(tier, str) else None))
        open_failures = [f for f in open_failures if f not in closed]
    found += [Recovery(f, None, None) for f in open_failures]
    found.sort(key=lambda r: r.failure.time)
    return found


def recovery_line(recovery: Recovery) -> str:
    """`recovered in 2.31 s (role tier): worker/job.worker.1 died -> actors_restarted`."""
    failure = recovery.failure
    where = "/".join(p for p in (failure.role, failure.actor) if p)
    what = f"{where + ' ' if where else ''}{failure.kind}"
    if recovery.done is None or recovery.duration_s is None:
        return f"  not recovered: {what}"
    tier = f" ({recovery.tier} tier)" if recovery.tier else ""
    return f"  recovered in {recovery.duration_s:.2f} s{tier}: {what} -> {recovery.done.kind}"


def recovery_lines(events: Sequence[JobEvent], limit: int = 10) -> list[str]:
    """The last `limit` recoveries of a timeline as lines (empty when nothing failed)."""
    found = recoveries(events)
    return [recovery_line(r) for r in found[-limit:]] if limit else []
