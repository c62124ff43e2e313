"""One seeded run: build the world, interleave faults with the manager's turns, check the
invariants after every step. A run is a pure function of its seed (`run_seed(seed)` twice
gives the same trace), so a violation is replayed with `--seed N`. The faults are applied by
`fault_injection`, the agents' and the CLI's requests sent by `commands`."""

from __future__ import annotations

import logging
import random
from collections.abc import Callable

from dlu_api.status import JobStage
from dlu_api.vocabulary import ActorStage
from dlu_prime.master.lifecycle import FencedError, ResumeError
from dlu_prime.master.manager import PrimeManager
from dlu_prime.master.schema import SchemaVersionError
from dlu_prime.master.state import SUB_MASTER_RANK, JobState
from dlu_prime.naming import sub_master_name
from dlu_prime.testing.sim import adapter
from dlu_prime.testing.sim.clock import SimClock
from dlu_prime.testing.sim.cluster import SimCluster
from dlu_prime.testing.sim.commands import Report, resend, send_report
from dlu_prime.testing.sim.crash import CrashPoint, MasterKilled
from dlu_prime.testing.sim.fault_injection import inject
from dlu_prime.testing.sim.faults import OWN_HANG, PEER_EFFECT, Kind, pick
from dlu_prime.testing.sim.invariants import Ledger, Violation, check_limits, check_stored
from dlu_prime.testing.sim.result import Result
from dlu_prime.testing.sim.store import SimStore
from dlu_prime.testing.sim.world import ELASTIC, JOB, sim_spec

# Result lives in result.py; it is still imported from here (benchmarks/simulate.py).
__all__ = ["FAULT_STEPS", "QUIET_STEPS", "STEP_S", "Result", "Run", "run_seed"]

FAULT_STEPS = 40
QUIET_STEPS = 60
STEP_S = 1.0


class Run:
    def __init__(
        self,
        seed: int,
        fault_steps: int = FAULT_STEPS,
        quiet_steps: int = QUIET_STEPS,
        autoscale: bool = False,
    ) -> None:
        self.seed = seed
        self.rng = random.Random(seed)
        self.fault_steps = fault_steps
        self.quiet_steps = quiet_steps
        self.clock = SimClock()
        self.crash = CrashPoint()
        self.store = SimStore(self.clock, random.Random(seed ^ 0x5EED), self.crash)
        self.spec = sim_spec(self.rng, autoscale=autoscale)
        self.cluster = self._cluster()
        self.ledger = Ledger()
        self.result = Result(seed)
        self.step_no = 0
        self.resumed = False
        self.consumed: set[int] = set()  # event numbers judged where they were made
        self.reports: list[Report] = []  # sent and not answered: asked again of a rebuilt master
        self.report_no = 0
        self.requests: dict[str, tuple[str, int, bool]] = {}  # request id -> role, size, accepted
        self.marks: dict[str, list[str]] = {}  # mark-unhealthy request id -> the names it marked
        self.in_failover = False
        self.resumes_left = 1
        self.inplace_counted = 0  # in-place restarts the job must have counted (own faults)
        self.manager = self._first()
        # A PrimeMaster killed during a store outage loses what it could not write (by design:
        # the job runs on from memory); it dies here only while its writes land.
        self.crash.allowed = lambda: adapter.synced(self.manager) and not self.store.down

    def _cluster(self) -> SimCluster:
        cluster = SimCluster(self.spec, self.clock, self.crash, {sub_master_name(JOB, ELASTIC): ELASTIC})
        cluster.hook = self._hook
        cluster.restart_actors = self._restart_actors
        return cluster

    # building the PrimeMaster ------------------------------------------------------------------
    def _first(self) -> PrimeManager:
        if self.rng.random() < 0.05:  # an older release's `dlu run` over a newer document
            newer = JobState(spec=self.spec)
            data = newer.dumps().replace(b'"schema_version":', b'"schema_version":9', 1)
            self.store.plant(JOB, data)
            try:
                adapter.create(self.spec, self.cluster, self.store, self.clock)
            except SchemaVersionError:
                pass
            else:
                raise Violation("newer schema", "create replaced a document of a newer schema")
            stored = self.store.peek(JOB)
            if stored is None or stored.data != data:
                raise Violation("newer schema", "the newer document was changed")
            self.store.delete(JOB)
            self.note("a newer-schema document was refused, then deleted by the operator")
        return adapter.create(self.spec, self.cluster, self.store, self.clock)

    def rebuild(self, why: str) -> None:
        """The PrimeMaster died: Ray starts a new one, which loads the stored state."""
        self.crash.disarm()
        self.note(f"PrimeMaster killed ({why}); rebuilt from the store")
        self.in_failover = False
        if self.store.down_until is not None:
            self.clock.now = max(self.clock.now, self.store.down_until)
        self.store.resume_due()
        self.ledger.pending_masters += 1
        self.manager = adapter.self_recover(self.spec, self.cluster, self.store, self.clock)
        self.resumed = True
        self.result.decisions += 1
        resend(self)

    def _restart_actors(self, names: list[str], reason: str) -> None:
        adapter.restart_actors(self.manager, names, reason)

    # the trace ---------------------------------------------------------------------------------
    def note(self, text: str) -> None:
        self.result.trace.append(f"[{self.step_no:3d} t={self.clock():8.1f}] {text}")

    # the world's reactions -----------------------------------------------------------------------
    def _hook(self, what: str, names: object) -> None:
        names = list(names)  # type: ignore[call-overload]
        if what == "restart":
            allowed = self.ledger.recent_actors(self.step_no)
            failover = self.manager.state.failover
            job_wide = failover is not None and str(failover.tier) == "job"
            extra = [n for n in names if n not in allowed]
            if extra and not job_wide:
                raise Violation("no healthy actor restarted", f"{extra} replaced with no fault on them")
        elif what == "failover" and not self.in_failover and self.rng.random() < 0.5:
            self.in_failover = True  # ranks of the role report while their peer is recovered
            try:
                peers = [
                    n
                    for n in self._ranks(ELASTIC)
                    if n not in names and self.cluster.stages.get(n) is ActorStage.RUNNING
                ]
                if peers:
                    agent = self.rng.choice(peers)
                    own = self.rng.random() < 0.5
                    message, error = OWN_HANG if own else PEER_EFFECT
                    self.note(
                        f"{agent} reports during the failover of {names}: {'own hang' if own else 'peer effect'}"
                    )
                    send_report(self, agent, message, error, own)
            finally:
                self.in_failover = False

    def _ranks(self, role: str) -> list[str]:
        return [
            n for n, a in self.manager.state.actors.items() if a.role == role and a.rank != SUB_MASTER_RANK
        ]

    # one step ----------------------------------------------------------------------------------
    def act(self, kind: Kind) -> None:
        """The world's fault of this step (`fault_injection.inject`)."""
        inject(self, kind)

    def turn(self) -> None:
        m = self.manager
        if m.state.stage is JobStage.STOPPED:
            return
        if m.state.stage is JobStage.STOPPING and self.store.down:
            return  # the final writes wait for the store
        adapter.turn(m, self.resumed)
        self.resumed = False
        self.result.decisions += 1

    def step(self, kind: Kind | None = None) -> None:
        """One step: time moves, the world acts (`kind`, else the seed's next choice while
        faults are on), the manager takes its turn, the invariants are checked."""
        self.step_no += 1
        self.clock.advance(STEP_S)
        self.store.resume_due()
        self.cluster.beat()
        if not self.store.down:
            adapter.store_back(self.manager)
        faults_on = self.step_no <= self.fault_steps
        try:
            if kind is not None:
                self.act(kind)
            elif faults_on:
                self.act(pick(self.rng))
            else:
                self.crash.disarm()
                if self.step_no > self.fault_steps + 3:  # training is done: the driver's ranks return
                    self.cluster.finish(self._ranks(ELASTIC))
            self.turn()
        except MasterKilled as killed:
            self.result.faults += 1
            self.rebuild(f"inside {killed}")
        self.check()

    def check(self) -> None:
        m = self.manager
        new = self.ledger.read(m.state, self.step_no, self.consumed)
        for event in new:
            self.note(f"  #{event.seq} {event.kind} {event.actor or event.role or ''}: {event.message[:100]}")
        self.ledger.overdue(self.step_no, m.state)
        check_limits(m.state)
        counted = m.state.roles[ELASTIC].inplace_restart_count
        if counted != self.inplace_counted:  # nothing here is a lost node's effect: none forgiven
            raise Violation(
                "counted once",
                f"role {ELASTIC} counts {counted} in-place restarts; {self.inplace_counted} own faults were counted",
            )
        if adapter.synced(m) and not self.store.down and not self.store.late:
            stored = self.store.peek(JOB)
            if stored is None or stored.data != m.state.dumps():
                check_stored(JobState.loads(stored.data) if stored is not None else None, m.state)

    def run(self) -> Result:
        return self.guarded(self._run)

    def _run(self) -> None:
        limit = self.fault_steps + self.quiet_steps
        while self.step_no < limit:
            self.step()
            if self.manager.state.stage is JobStage.STOPPED:
                if not self._resume():
                    break
                limit = max(limit, self.step_no + self.quiet_steps)
        self.check_end()

    def finish(self) -> Result:
        """No more faults: the job must reach STOPPED within the quiet steps."""

        def quiet() -> None:
            self.fault_steps = self.step_no
            for _ in range(self.quiet_steps):
                if self.manager.state.stage is JobStage.STOPPED:
                    break
                self.step()
            self.check_end()

        return self.guarded(quiet)

    def check_end(self) -> None:
        if self.manager.state.stage is not JobStage.STOPPED:
            raise Violation(
                "the end",
                f"faults stopped at step {self.fault_steps} but the job is {self.manager.state.stage} "
                f"at step {self.step_no}",
            )

    def guarded(self, body: Callable[[], None]) -> Result:
        """Run `body`; whatever it breaks is this run's violation."""
        try:
            body()
        except Violation as exc:
            self.result.violation = str(exc)
        except FencedError as exc:
            self.result.violation = f"only master fenced: {exc}"
        except Exception as exc:
            self.result.violation = f"manager raised: {type(exc).__name__}: {exc}"
        except MasterKilled as exc:  # a crash point left armed where no step catches it
            self.result.violation = f"simulation error: MasterKilled escaped at {exc}"
        state = self.manager.state
        self.result.steps = self.step_no
        self.result.events = state.event_seq
        self.result.stage = str(state.stage)
        self.result.reason = state.reason.splitlines()[0] if state.reason else ""
        return self.result

    def _resume(self) -> bool:
        """`dlu resume` of a job stopped at a limit, once per run (its numbering continues)."""
        state = self.manager.state
        if state.exit_code != 1 or self.resumes_left <= 0 or self.store.down or self.rng.random() < 0.5:
            return False
        adapter.store_back(self.manager)  # `dlu run` ends once its final state is written
        self.manager.flush()
        if not adapter.synced(self.manager):
            return False
        self.resumes_left -= 1
        self.crash.disarm()
        self.cluster = self._cluster()
        self.requests.clear()  # the CLI's requests were to the run that ended
        self.marks.clear()
        try:
            self.manager = adapter.resume(self.spec, self.cluster, self.store, self.clock)
        except ResumeError as exc:
            self.note(f"dlu resume refused: {exc}")
            return False
        self.note("dlu resume (on a fresh cluster)")
        self.inplace_counted = self.manager.state.roles[ELASTIC].inplace_restart_count
        self.fault_steps = self.step_no + self.fault_steps // 2
        return True


def run_seed(
    seed: int, fault_steps: int = FAULT_STEPS, quiet_steps: int = QUIET_STEPS, autoscale: bool = False
) -> Result:
    """`autoscale`: the job auto-scales (single-job mode) among the faults."""
    before = logging.root.manager.disable
    logging.disable(logging.CRITICAL)  # the manager logs every decision: not the simulation's output
    try:
        try:
            run = Run(seed, fault_steps, quiet_steps, autoscale)
        except Violation as exc:  # the first PrimeMaster's creation (a newer-schema document)
            return Result(seed, violation=str(exc))
        return run.run()
    finally:
        logging.disable(before)  # the caller's logging as it was (a test's caplog reads it after)
