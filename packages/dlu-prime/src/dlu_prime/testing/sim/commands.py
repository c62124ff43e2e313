"""What the ranks' agents (in-place reports, through their SubMaster) and the CLI (`dlu scale`,
`dlu mark-unhealthy`) send the PrimeMaster, each answer checked against what it must count;
and what they ask again of a rebuilt PrimeMaster. Functions over the run's state (`Sender`),
so that the fault injection and the runner both send them without importing each other."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from dlu_api.status import JobStage
from dlu_api.vocabulary import InPlaceVerdict
from dlu_prime.master.manager import PrimeManager
from dlu_prime.master.resize import ScaleError
from dlu_prime.testing.sim import adapter
from dlu_prime.testing.sim.faults import Kind
from dlu_prime.testing.sim.invariants import Fault, Ledger, Violation
from dlu_prime.testing.sim.result import Result
from dlu_prime.testing.sim.world import ELASTIC


@dataclass(eq=False)
class Report:
    """An in-place report sent and not yet answered: asked again of a rebuilt PrimeMaster with
    the same id (`rid`), so one that saved its judgement and died before answering answers
    from it (seed 36: counted twice while reports carried no id). `before`, `count_before`:
    the event number and the role's count when it was first sent."""

    agent: str
    message: str
    error: str
    own: bool
    fault: Fault | None
    rid: str
    before: int
    count_before: int


class Sender(Protocol):
    """What sending reads and records: the current PrimeMaster, the ledger of faults, the
    result, and what is sent and not yet answered (asked again of a rebuilt PrimeMaster)."""

    manager: PrimeManager
    ledger: Ledger
    result: Result
    step_no: int
    consumed: set[int]  # event numbers judged where they were made
    reports: list[Report]  # sent and not answered
    report_no: int
    requests: dict[str, tuple[str, int, bool]]  # request id -> role, size, accepted
    marks: dict[str, list[str]]  # mark-unhealthy request id -> the names it marked
    inplace_counted: int  # in-place restarts the job must have counted (own faults)

    def note(self, text: str) -> None: ...


def send_report(
    run: Sender,
    agent: str,
    message: str,
    error: str,
    own: bool,
    fault: Fault | None = None,
    retry: Report | None = None,
) -> None:
    """A rank's agent reports a failed training process through its SubMaster; asked again
    of a rebuilt PrimeMaster until answered (`fault`, `retry`: the one a retry is about)."""
    m = run.manager
    if own and fault is None:
        fault = run.ledger.add(Kind.HANG if "stuck" in message else Kind.CRASH, [agent], run.step_no)
        run.result.faults += 1
    in_flight = m.state.failover
    judged = retry is not None and retry.rid in m.state.requests  # saved before the death
    if not judged and (
        m.state.stage is not JobStage.RUNNING or (in_flight is not None and agent in in_flight.actors)
    ):
        own = False  # a job restart or the end under way, or its actor is being replaced: joins
        if fault is not None:
            fault.counted += 1  # judged as the recovery's: nothing more to count
            fault = None
    run.report_no += 1
    rid = retry.rid if retry is not None else f"report-{run.report_no}"
    before = retry.before if retry is not None else m.state.event_seq
    count_before = retry.count_before if retry is not None else m.state.roles[ELASTIC].inplace_restart_count
    report = Report(agent, message, error, own, fault, rid, before, count_before)
    run.reports.append(report)
    decision = adapter.note_inplace_restart(m, ELASTIC, message, agent, error, report_id=rid)
    run.reports.remove(report)
    run.result.decisions += 1
    made = [e for e in m.state.events if e.seq > before]
    counted = [e for e in made if str(e.kind) in ("inplace_restart", "restart_limit") and e.actor == agent]
    run.consumed.update(e.seq for e in counted)
    run.note(
        f"in-place report of {agent} -> {decision.verdict} counted={decision.counted}: {decision.reason[:80]}"
    )
    delta = m.state.roles[ELASTIC].inplace_restart_count - count_before
    if own:
        stop = decision.verdict is InPlaceVerdict.STOP
        if not stop and (not decision.counted or delta != 1 or len(counted) != 1):
            raise Violation(
                "counted once",
                f"{agent}'s own failure ({message}) counted {delta} times: {decision.verdict} {decision.reason}",
            )
        assert fault is not None
        fault.counted += 1
        if not stop:
            run.inplace_counted += 1
    elif decision.counted or delta != 0:
        raise Violation("counted once", f"{agent}'s report of a peer's fault counted: {decision.reason}")


def send_scale(run: Sender, rid: str, role: str, size: int, retry: bool = False) -> None:
    """`dlu scale` from the CLI: a retry (the same id) of an accepted request is known, never run again."""
    first = run.requests.get(rid)
    try:
        answer = adapter.scale(run.manager, role, size, rid)
    except ScaleError as exc:
        if retry and first is not None and first[2]:
            raise Violation("commands", f"retry of accepted request {rid} refused: {exc}") from exc
        run.note(f"dlu scale {role} {size} ({rid}) refused: {str(exc)[:80]}")
        run.requests.setdefault(rid, (role, size, False))
        return
    finally:
        run.result.decisions += 1
    if retry and first is not None and first[2] and answer != "known":
        raise Violation("commands", f"retry of accepted request {rid} ran again ({answer})")
    run.note(f"dlu scale {role} {size} ({rid}){' retried' if retry else ''}: {answer}")
    run.requests[rid] = (role, size, answer in ("began", "known"))


def resend(run: Sender) -> None:
    """What the SubMaster and the CLI ask again of a rebuilt PrimeMaster."""
    reports, run.reports = run.reports, []
    for report in reports:
        send_report(run, report.agent, report.message, report.error, report.own, report.fault, report)
    for rid, (role, size, accepted) in list(run.requests.items()):
        if accepted:
            send_scale(run, rid, role, size, retry=True)
    for rid, marked in run.marks.items():  # the CLI asks again: marked once, never twice
        landed = rid in run.manager.state.requests
        if adapter.mark_unhealthy(run.manager, marked, rid) and landed:
            raise Violation("commands", f"mark-unhealthy {rid} retried was marked again")
