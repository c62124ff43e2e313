"""What must hold after every step of a simulated run.

- counted once: each injected fault is counted exactly once on its culprit (a failover started
  for one of its actors, its in-place restart, the resize its node loss began, or the stop it
  led to), and no recovery is counted where nothing was injected;
- no healthy actor restarted: an actor is replaced only when a fault took it (or by a job-level
  restart the ladder chose); no failover or resize fails where the simulation made nothing fail;
- limits: no budget passes its limit, and a failed job's reason names the limit it reached;
- events: numbers strictly increase, across PrimeMaster restarts and `dlu resume`;
- stored = memory: once the writer has nothing pending, the stored document is the state;
- commands: a request retried after a PrimeMaster restart is answered, never run twice;
- the end: once faults stop, the job reaches STOPPED (checked by the runner).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from dataclasses import dataclass, field

from dlu_api.status import JobEvent, JobStage
from dlu_prime.master.state import JobState
from dlu_prime.testing.sim.faults import Kind

OVERDUE_STEPS = 6
"""Steps (monitoring passes) a death fault may wait for its recovery to be counted."""

RECENT_STEPS = 8
"""Steps during which a fault's actors may be replaced (its recovery, also finished late)."""

COUNTING = frozenset({"failover_started", "inplace_restart", "restart_limit", "master_restarted"})

LIMIT_WORDS = (
    "max_restart=",
    "job_max_restart=",
    "master_max_restart=",
    "global_restart_budget=",
    "node_max_restart=",
    "needs at least",
    "a short-lived stage",
)


class Violation(Exception):
    """An invariant does not hold; the message names it."""

    def __init__(self, invariant: str, detail: str) -> None:
        super().__init__(f"{invariant}: {detail}")
        self.invariant = invariant


@dataclass
class Fault:
    id: int
    kind: Kind
    actors: frozenset[str]
    step: int
    roles: set[str] = field(default_factory=set[str])  # node loss: the roles it hit
    counted: int = 0
    handled: bool = False  # a node loss: recovered (its resize, or a failover of its actors)
    needs_count: bool = False  # a node loss that took actors the ladder must recover (counted)


class Ledger:
    """The faults injected and what the job counted for them (read from its events)."""

    def __init__(self) -> None:
        self.faults: list[Fault] = []
        self.cursor = 0  # the last event number read
        self.pending_masters = 0
        self.failures_caused = 0  # failovers or resizes the simulation made fail (none today)

    def add(self, kind: Kind, actors: Iterable[str], step: int, roles: Collection[str] = ()) -> Fault:
        fault = Fault(len(self.faults), kind, frozenset(actors), step, set(roles))
        self.faults.append(fault)
        return fault

    def pending(self) -> list[Fault]:
        return [f for f in self.faults if f.kind is not Kind.MASTER and not self._done(f)]

    @staticmethod
    def _done(fault: Fault) -> bool:
        if fault.kind is Kind.NODE:
            return fault.handled and (fault.counted > 0 or not fault.needs_count)
        return fault.counted > 0

    def recent_actors(self, step: int) -> set[str]:
        return {a for f in self.faults if step - f.step <= RECENT_STEPS for a in f.actors}

    # events ------------------------------------------------------------------------------------
    def read(self, state: JobState, step: int, consumed: Collection[int] = ()) -> list[JobEvent]:
        """The events past the cursor: numbered strictly upwards, each counting one accounted
        for. `consumed`: numbers already judged where they were made (in-place reports)."""
        new = [e for e in state.events if e.seq > self.cursor]
        last = self.cursor
        for event in new:
            if event.seq <= last:
                raise Violation("events", f"event {event.seq} after {last}: numbers must strictly increase")
            last = event.seq
        if state.events and state.event_seq < state.events[-1].seq:
            raise Violation("events", f"event_seq {state.event_seq} is behind event {state.events[-1].seq}")
        if state.event_seq < self.cursor:  # numbers already shown would be given again
            raise Violation(
                "events", f"the event numbering went back from {self.cursor} to {state.event_seq}"
            )
        for event in new:
            if event.seq not in consumed:
                self._account(event, state, step)
        self.cursor = max(self.cursor, last)
        return new

    def _account(self, event: JobEvent, state: JobState, step: int) -> None:
        kind = str(event.kind)
        if kind in ("failover_failed", "resize_failed", "elastic_reform_failed"):
            if self.failures_caused == 0:
                raise Violation(
                    "no healthy actor restarted", f"{kind} where nothing was made to fail: {event.message}"
                )
            return
        if kind == "stage" and "-> STOPPING" in event.message:
            for fault in self.pending():  # the stop is what they led to
                fault.counted += 1
                fault.handled = True
            return
        if kind == "master_restarted":
            if self.pending_masters <= 0:
                raise Violation(
                    "counted once", f"a PrimeMaster restart counted with none injected: {event.message}"
                )
            self.pending_masters -= 1
            return
        if kind == "resize_started" and "node lost" in event.message:
            self._charge(event, lambda f: f.kind is Kind.NODE and event.role in f.roles, event.role)
            return
        if kind == "failover_joined" and event.actor is not None:
            actor = event.actor
            self._charge(event, lambda f: f.kind is Kind.NODE and actor in f.actors, event.role)
            return
        if kind in COUNTING and event.actor is not None:
            actor = event.actor
            self._charge(event, lambda f: actor in f.actors and f.kind is not Kind.MASTER, event.role)

    def _charge(self, event: JobEvent, matches: object, role: str | None) -> None:
        """Account `event` to the first pending fault it matches. A node loss is recovered by
        the resize of the elastic role it shrank (not a count) and, for the other actors it took,
        by one counted failover (the rest join it): counted at most once."""
        assert callable(matches)
        kind = str(event.kind)
        for fault in self.faults:
            if fault.kind is Kind.MASTER or not matches(fault) or self._done(fault):
                continue
            if fault.kind is Kind.NODE:
                fault.handled = True
                if kind == "failover_started":
                    fault.counted += 1
                return
            fault.counted += 1
            return
        if kind in ("resize_started", "failover_joined"):
            return  # a node already recovered: a shrink or a joined recovery counts nothing
        raise Violation(
            "counted once",
            f"event {event.seq} {event.kind} ({event.actor or event.role}) counts a recovery no "
            f"pending fault explains: {event.message[:160]}",
        )

    def overdue(self, step: int, state: JobState) -> None:
        if state.stage is not JobStage.RUNNING:
            return
        for fault in self.pending():
            if fault.kind in (Kind.CRASH, Kind.HANG):
                continue  # judged where reported
            if not fault.actors & set(state.actors):
                fault.handled = True  # a resize removed them before they were judged: nothing
                fault.counted = max(fault.counted, 1)  # left to recover (nor to count)
                continue
            if step - fault.step > OVERDUE_STEPS:
                left = f" (roles it hit: {sorted(fault.roles)})" if fault.roles else ""
                raise Violation(
                    "counted once",
                    f"fault {fault.id} {fault.kind} of {sorted(fault.actors)} at step {fault.step} "
                    f"counted {fault.counted} times after {step - fault.step} steps{left}",
                )


def check_limits(state: JobState) -> None:
    """No budget past its limit; a job that failed names the limit in its reason."""
    spec = state.spec
    limits = spec.limits
    for name, role in state.roles.items():
        top = spec.role(name).max_restart
        for what, value in (
            ("restart_count", role.restart_count),
            ("inplace_restart_count", role.inplace_restart_count),
            ("sub_master_restart_count", role.sub_master_restart_count),
        ):
            if value > top or value < 0:
                raise Violation("limits", f"role {name} {what}={value} with max_restart={top}")
    for what, value, top in (
        ("job_restart_count", state.job_restart_count, limits.job_max_restart),
        ("master_restart_count", state.master_restart_count, limits.master_max_restart + 1)
        if state.stage is JobStage.RUNNING
        else ("master_restart_count", 0, 0),
        ("global_restart_count", state.global_restart_count, limits.global_restart_budget),
    ):
        if value > top:
            raise Violation("limits", f"{what}={value} past its limit {top}")
    if state.stage is JobStage.STOPPED and state.exit_code == 1:
        first = state.reason.splitlines()[0] if state.reason else ""
        if not any(word in first for word in LIMIT_WORDS):
            raise Violation("limits", f"the job failed with a reason that names no limit: {first!r}")


def check_stored(stored: JobState | None, memory: JobState) -> None:
    if stored is None:
        raise Violation("stored = memory", "nothing stored")
    a = stored.model_dump(mode="json")
    b = memory.model_dump(mode="json")
    if a != b:
        diff = sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))
        raise Violation("stored = memory", f"stored document differs from memory in {diff}")
