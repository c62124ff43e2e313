"""What SubMasters and ranks ask of the PrimeMaster on their own threads, decided like the rest:
a SubMaster's restart of actors (counted and limited before anything is replaced), and a rank's
report of a failed training process (judged by cause: `failover.judge_inplace`)."""

from __future__ import annotations

from dlu_api.vocabulary import ActorStage, EventKind, InPlaceDecision, InPlaceVerdict
from dlu_prime.master.change_types import ActorsPlaced, ActorsRestarting, InPlaceJudged, Note
from dlu_prime.master.core import memory_chain
from dlu_prime.master.core.commands import AskStop, Command, FindDeadPeers, Purpose, ReplaceActors, Wake
from dlu_prime.master.core.decision import Decision
from dlu_prime.master.core.events import Done, InPlaceReported, RestartRequested
from dlu_prime.master.failover import judge_inplace, role_limit_reached
from dlu_prime.master.lifecycle import RestartLimitError
from dlu_prime.master.resize import resizing
from dlu_prime.master.state import INPLACE_ACTION, SUB_MASTER_RANK, JobState


def restart_requested(state: JobState, event: RestartRequested) -> Decision:
    """Replace actors of one or more roles: counted, limited and saved before the scheduler
    acts. A failover that asks for it (through a SubMaster) was already counted and checked; a
    memory relaunch's is not counted at all."""
    names = event.names
    unknown = [n for n in names if n not in state.actors]
    if unknown:
        return Decision(error=KeyError(f"no such actor(s): {', '.join(unknown)}"))
    in_flight = state.failover
    counted = not (in_flight is not None and set(names) <= set(in_flight.actors))
    counted = counted and not memory_chain.covers(state, names)  # a memory relaunch is no fault
    for role in sorted({state.actors[n].role for n in names}) if counted else []:
        over = role_limit_reached(state, role)
        if over is not None:
            return Decision(
                error=RestartLimitError(f"{over} (restarting {', '.join(names)}: {event.reason})")
            )
    change = ActorsRestarting(list(names), event.reason, counted)
    return Decision((change,), (ReplaceActors(names, Purpose.RESTART_REQUEST),))


def replaced(done: Done) -> Decision:
    if done.error is not None:
        return Decision(error=done.error)
    count = len(done.value or {})
    note = Note(EventKind.ACTORS_RESTARTED, f"{count} actor(s) replaced and ready")
    return Decision((ActorsPlaced(dict(done.value or {}), ActorStage.READY, fresh=True, note=note),))


def inplace_reported(state: JobState, event: InPlaceReported) -> Decision:
    """First the view the judgement needs: which of the rank's peers are dead. A resize in
    flight already handles its leaving actors: they are not polled. A report judged before
    (the SubMaster asks again a rebuilt PrimeMaster that saved its judgement and died before
    answering) is answered from what it came to: counted once."""
    seen = state.requests.get(event.report_id) if event.report_id is not None else None
    if seen is not None and seen.action == INPLACE_ACTION:
        verdict = InPlaceVerdict(seen.verdict)
        return Decision(reply=InPlaceDecision(verdict, seen.message, seen.counted))
    leaving = resizing(state)
    peers = {
        n: a.node_id
        for n, a in state.actors.items()
        if a.role == event.role and a.rank != SUB_MASTER_RANK and n != event.agent and n not in leaving
    }
    return Decision((), (FindDeadPeers(peers, event),))


def inplace_judged(state: JobState, done: Done, command: FindDeadPeers) -> Decision:
    """A fault of its own (tier 1, counted here so the count survives the SubMaster), the effect
    of a peer's fault being handled (joined, not counted), or one over the role's limit (stop)."""
    if done.error is not None:
        return Decision(error=done.error)
    report = command.report
    dead: list[str] = list(done.value or ())
    decision = judge_inplace(
        state, report.role, report.agent, report.message, dead, report.error, report.recovered
    )
    commands: list[Command] = []
    if decision.verdict is InPlaceVerdict.STOP:
        commands.append(AskStop(decision.reason))
    elif dead:
        commands.append(Wake())  # the dead peer's failover starts at once
    return Decision(
        (InPlaceJudged(report.role, report.agent, report.message, decision, report.report_id),),
        tuple(commands),
        decision,
    )
