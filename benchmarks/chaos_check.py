"""The chaos campaign's verdict: a pure function of what was injected and what the jobs recorded.

Accounting rules: every recovery is one event on the job's timeline (RECOVERY_KINDS). An
injected fault must cause exactly one, naming the fault's culprit: the actor (a training
process's fault is its rank's ElasticWorker), the PrimeMaster (a `master_restarted` event), or
a removed node (its id, or one of the job's actors that ran there). A recovery event inside a
fault's window that names someone else is mis-attributed (typically a healthy peer whose
collective failed); one outside every window is spurious.
"""

from __future__ import annotations

import math
import statistics
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from dlu_api.status import JobEvent, JobStatus

RECOVERY_KINDS = frozenset({"inplace_restart", "failover_started", "master_restarted", "node_relaunch"})
MASTER_KIND = "master_restarted"
PRIME_MASTER_FAULT = "prime_master_kill"
# After the runner saw the job back at work, the recovery's own events may still be landing.
GRACE_S = 5.0


@dataclass(frozen=True)
class Injected:
    """One fault as injected. `at` is time.time() just before it; `settled_at` when the job was
    seen back at work (every rank past its pre-fault step), None if never."""

    kind: str
    job: str
    at: float
    actor: str | None = None
    node: str | None = None
    node_actors: tuple[str, ...] = ()
    settled_at: float | None = None
    lost_steps: int = 0
    planned: str = ""  # the planned kind it came from (an overlapping kind injects two)

    def blames(self, event: JobEvent) -> bool:
        """Whether `event` names this fault's culprit."""
        if self.kind == PRIME_MASTER_FAULT:
            return event.kind == MASTER_KIND
        if event.kind == MASTER_KIND:
            return False
        if self.node is not None:
            return event.node_id == self.node or (event.actor is not None and event.actor in self.node_actors)
        return self.actor is not None and event.actor == self.actor

    def culprit(self) -> str:
        if self.kind == PRIME_MASTER_FAULT:
            return "PrimeMaster"
        if self.node is not None:
            return f"node {self.node[:12]}"
        return self.actor or "?"


@dataclass(frozen=True)
class Accounting:
    injected: tuple[Injected, ...]
    recovered: tuple[tuple[Injected, JobEvent], ...]
    missed: tuple[Injected, ...]
    duplicated: tuple[tuple[Injected, tuple[JobEvent, ...]], ...]
    mis_attributed: tuple[tuple[Injected, JobEvent], ...]
    spurious: tuple[tuple[str, JobEvent], ...]  # (job, event)


def _windows(faults: Sequence[Injected], grace_s: float) -> list[tuple[float, float]]:
    """[at, end] per fault: until its settle plus grace, or (never settled) the next fault of
    its job, or forever."""
    out: list[tuple[float, float]] = []
    for fault in faults:
        if fault.settled_at is not None:
            end = fault.settled_at + grace_s
        else:
            later = [f.at for f in faults if f.job == fault.job and f.at > fault.at]
            end = min(later) if later else math.inf
        out.append((fault.at, end))
    return out


def account(
    faults: Sequence[Injected], events: Mapping[str, Sequence[JobEvent]], grace_s: float = GRACE_S
) -> Accounting:
    """Attribute every recovery event of every job to the injected faults (see the module doc).

    An event blaming several open faults goes to the latest of them that has none yet (two
    PrimeMaster kills in a row each get their own restart)."""
    ordered = sorted(faults, key=lambda f: f.at)
    windows = _windows(ordered, grace_s)
    matched: list[list[JobEvent]] = [[] for _ in ordered]
    mis: list[tuple[Injected, JobEvent]] = []
    spurious: list[tuple[str, JobEvent]] = []
    timeline = sorted(
        ((job, e) for job, found in events.items() for e in found if e.kind in RECOVERY_KINDS),
        key=lambda item: item[1].time,
    )
    for job, event in timeline:
        open_ = [
            i for i, f in enumerate(ordered) if f.job == job and windows[i][0] <= event.time <= windows[i][1]
        ]
        owners = [i for i in open_ if ordered[i].blames(event)]
        if owners:
            free = [i for i in owners if not matched[i]]
            matched[(free or owners)[-1]].append(event)
        elif open_:
            mis.append((ordered[open_[-1]], event))
        else:
            spurious.append((job, event))
    return Accounting(
        injected=tuple(ordered),
        recovered=tuple((f, m[0]) for f, m in zip(ordered, matched, strict=True) if len(m) == 1),
        missed=tuple(f for f, m in zip(ordered, matched, strict=True) if not m),
        duplicated=tuple((f, tuple(m)) for f, m in zip(ordered, matched, strict=True) if len(m) > 1),
        mis_attributed=tuple(mis),
        spurious=tuple(spurious),
    )


@dataclass(frozen=True)
class LossCheck:
    """The final loss of the campaign's job against a fault-free run of the same config."""

    expected: str | None
    got: str | None

    @property
    def ok(self) -> bool:
        return self.expected is not None and self.expected == self.got


@dataclass(frozen=True)
class RecordCount:
    """What the pipeline's consumers saw, counted at the consumers: `received` holds every id
    as often as it arrived."""

    sent: int
    received: tuple[int, ...]

    @property
    def lost(self) -> int:
        return self.sent - len({r for r in self.received if 0 <= r < self.sent})

    @property
    def duplicated(self) -> int:
        return len(self.received) - len(set(self.received))

    @property
    def unexpected(self) -> int:
        return len({r for r in self.received if not 0 <= r < self.sent})


@dataclass(frozen=True)
class LimitCheck:
    """A job run into a limit on purpose: it must stop failed, with a reason naming the limit
    (`limit`, e.g. 'max_restart=2') and the culprit actor."""

    limit: str
    culprit: str
    exit_code: int | None
    reason: str

    @property
    def ok(self) -> bool:
        return self.exit_code not in (None, 0) and self.limit in self.reason and self.culprit in self.reason


@dataclass(frozen=True)
class Report:
    accounting: Accounting
    planned: int
    outcomes: Mapping[str, JobStatus]
    loss: LossCheck | None = None
    leaks: tuple[str, ...] = ()
    records: RecordCount | None = None
    limit: LimitCheck | None = None
    seed: int | str = ""
    notes: tuple[str, ...] = field(default=())

    def problems(self) -> list[str]:
        """Everything that makes the campaign fail, one line each (empty: it passed)."""
        a = self.accounting
        out: list[str] = []
        if len(a.injected) < self.planned:
            out.append(f"only {len(a.injected)} of {self.planned} planned faults were injected")
        out += [f"MISSED: {_fault(f, a)}: no recovery event names {f.culprit()}" for f in a.missed]
        out += [
            f"DUPLICATED: {_fault(f, a)}: {len(found)} recovery events: "
            + "; ".join(_event(e, a) for e in found)
            for f, found in a.duplicated
        ]
        out += [f"MIS-ATTRIBUTED: {_fault(f, a)} -> {_event(e, a)}" for f, e in a.mis_attributed]
        out += [f"SPURIOUS: {job}: {_event(e, a)}" for job, e in a.spurious]
        for job, status in self.outcomes.items():
            if status.exit_code != 0:
                out.append(
                    f"JOB FAILED: {job} exit code {status.exit_code}: {status.reason.splitlines()[0] if status.reason else ''}"
                )
        if self.loss is not None and not self.loss.ok:
            out.append(f"LOSS MISMATCH: final loss {self.loss.got} vs fault-free {self.loss.expected}")
        out += [f"LEAK: {leak}" for leak in self.leaks]
        if self.records is not None and (
            self.records.lost or self.records.duplicated or self.records.unexpected
        ):
            r = self.records
            out.append(
                f"RECORDS: {r.lost} lost, {r.duplicated} duplicated, {r.unexpected} unexpected of {r.sent}"
            )
        if self.limit is not None and not self.limit.ok:
            out.append(
                f"LIMIT: expected a failed stop naming {self.limit.limit} and {self.limit.culprit}; "
                f"got exit code {self.limit.exit_code}: {self.limit.reason.splitlines()[0] if self.limit.reason else ''}"
            )
        return out

    @property
    def ok(self) -> bool:
        return not self.problems()

    def lines(self) -> list[str]:
        """The figures, then one line per problem."""
        a = self.accounting
        kinds = Counter(f.planned or f.kind for f in a.injected)
        out = [
            f"chaos campaign (seed {self.seed}): {len(a.injected)} faults injected of {self.planned} planned",
            f"  faults injected  {len(a.injected):5d}  ({', '.join(f'{k} {n}' for k, n in sorted(kinds.items()))})",
            f"  recoveries       {len(a.recovered):5d}  (exactly one recovery event naming the culprit)",
            f"  missed           {len(a.missed):5d}",
            f"  duplicated       {len(a.duplicated):5d}",
            f"  mis-attributed   {len(a.mis_attributed):5d}",
            f"  spurious         {len(a.spurious):5d}",
            f"  lost steps       {sum(f.lost_steps for f in a.injected):5d}  (redone after restarts, from status polls)",
        ]
        if self.loss is not None:
            verdict = "match" if self.loss.ok else "MISMATCH"
            out.append(f"  final loss       {self.loss.got} vs fault-free {self.loss.expected}: {verdict}")
        out.append(f"  leaks            {len(self.leaks):5d}")
        if self.records is not None:
            r = self.records
            out.append(
                f"  pipeline records {r.sent:5d} sent: {r.lost} lost, {r.duplicated} duplicated, "
                f"{r.unexpected} unexpected (counted at the consumers)"
            )
        if self.limit is not None:
            first = self.limit.reason.splitlines()[0] if self.limit.reason else ""
            out.append(
                f"  limit stop       {'ok' if self.limit.ok else 'WRONG'}: exit {self.limit.exit_code}: {first}"
            )
        out += self._settle_lines()
        out += [
            f"  tiers            {k}: {', '.join(f'{t} {n}' for t, n in sorted(c.items()))}"
            for k, c in self.tiers().items()
        ]
        out += [f"  note: {note}" for note in self.notes]
        out += [f"  {problem}" for problem in self.problems()]
        out.append("PASS" if self.ok else "FAIL")
        return out

    def tiers(self) -> dict[str, Counter[str]]:
        """Per injected kind, the tiers (or kinds) of the recovery events attributed to it."""
        out: dict[str, Counter[str]] = {}
        for fault, event in self.accounting.recovered:
            out.setdefault(fault.kind, Counter())[event.tier or event.kind] += 1
        return dict(sorted(out.items()))

    def _settle_lines(self) -> list[str]:
        spans: dict[str, list[float]] = {}
        for f in self.accounting.injected:
            if f.settled_at is not None:
                spans.setdefault(f.kind, []).append(f.settled_at - f.at)
        return [
            f"  back to work     {k}: median {statistics.median(v):.1f} s, max {max(v):.1f} s ({len(v)})"
            for k, v in sorted(spans.items())
        ]


def _origin(a: Accounting) -> float:
    return a.injected[0].at if a.injected else 0.0


def _fault(f: Injected, a: Accounting) -> str:
    return f"{f.kind} on {f.culprit()} at +{f.at - _origin(a):.1f} s"


def _event(e: JobEvent, a: Accounting) -> str:
    tier = f" [{e.tier}]" if e.tier else ""
    return f"+{e.time - _origin(a):.1f} s {e.kind}{tier} actor={e.actor} node={(e.node_id or '-')[:12]}: {e.message}"


def check(
    faults: Sequence[Injected],
    events: Mapping[str, Sequence[JobEvent]],
    finals: Mapping[str, JobStatus],
    *,
    planned: int | None = None,
    loss: LossCheck | None = None,
    leaks: Sequence[str] = (),
    records: RecordCount | None = None,
    limit: LimitCheck | None = None,
    seed: int | str = "",
    notes: Sequence[str] = (),
    grace_s: float = GRACE_S,
) -> Report:
    """The campaign's report from what was injected, the jobs' full timelines and final statuses."""
    return Report(
        accounting=account(faults, events, grace_s),
        planned=len(faults) if planned is None else planned,
        outcomes=dict(finals),
        loss=loss,
        leaks=tuple(leaks),
        records=records,
        limit=limit,
        seed=seed,
        notes=tuple(notes),
    )
