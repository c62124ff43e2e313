"""The world's faults, one per step: the seed picks a kind and this applies it where it can
(a rank's crash or hang, an actor's, SubMaster's or node's loss, mark-unhealthy, a PrimeMaster's
death between or inside commands, the store's hang, death or slowness, `dlu scale`, `dlu stop`),
recording each in the ledger the invariants check. Its own module: the runner's loop stays short."""

from __future__ import annotations

import random
from typing import Protocol

from dlu_api.status import JobStage
from dlu_api.vocabulary import ActorStage
from dlu_prime.master.state import SUB_MASTER_RANK
from dlu_prime.naming import sub_master_name
from dlu_prime.testing.sim import adapter
from dlu_prime.testing.sim.clock import SimClock
from dlu_prime.testing.sim.cluster import SimCluster
from dlu_prime.testing.sim.commands import Sender, send_report, send_scale
from dlu_prime.testing.sim.crash import CrashPoint
from dlu_prime.testing.sim.faults import DEATHS, OWN_CRASH, OWN_HANG, Kind
from dlu_prime.testing.sim.invariants import Violation
from dlu_prime.testing.sim.store import SimStore
from dlu_prime.testing.sim.world import ELASTIC, JOB, SIMPLE


class Target(Sender, Protocol):
    """What a fault acts on: the seed's choices, the simulated cluster, store and crash point,
    and the rebuild of a PrimeMaster killed between commands (the runner's)."""

    rng: random.Random
    clock: SimClock
    cluster: SimCluster
    store: SimStore
    crash: CrashPoint

    def rebuild(self, why: str) -> None: ...


def inject(run: Target, kind: Kind) -> None:
    """Apply `kind` if it can happen now (a job not RUNNING only sees the store slow down)."""
    m = run.manager
    state = m.state
    if state.stage is not JobStage.RUNNING and kind not in (Kind.STORE_SLOW, Kind.NOTHING):
        return
    busy = set(state.resize.added) | set(state.resize.removed) if state.resize else set[str]()
    # A failover's actors are never spared: a death of one between a PrimeMaster's death and
    # the rebuilt one's resume is a new fault, whether a placed replacement's (seeds 8553,
    # 11945), one not replaced yet (17404), a job restart's saved in RUNNING (17842) or the
    # elastic role's SubMaster's (16919); so is one of the other actors (seed 194).
    running = [
        n
        for n, s in run.cluster.stages.items()
        if s is ActorStage.RUNNING
        and n in state.actors
        and n not in busy
        and n not in run.cluster.reconstructed
    ]
    ranks = [
        n for n in running if state.actors[n].role == ELASTIC and state.actors[n].rank != SUB_MASTER_RANK
    ]
    if kind in DEATHS and any(f.kind in DEATHS for f in run.ledger.pending()):
        return  # one death per monitoring pass: each has its recovery to be counted on
    if kind in (Kind.CRASH, Kind.HANG) and ranks:
        agent = run.rng.choice(ranks)
        message, error = OWN_CRASH if kind is Kind.CRASH else OWN_HANG
        run.note(f"{kind} of {agent}")
        send_report(run, agent, message, error, True)
    elif kind is Kind.KILL and running:
        name = run.rng.choice([n for n in running if state.actors[n].rank != SUB_MASTER_RANK] or running)
        run.note(f"actor kill {name}")
        run.ledger.add(kind, [name], run.step_no)
        run.result.faults += 1
        run.cluster.kill_actor(name)
    elif kind is Kind.SUB:
        sub = sub_master_name(JOB, ELASTIC)
        if sub in running:
            run.note(f"SubMaster kill {sub}")
            run.ledger.add(kind, [sub], run.step_no)
            run.result.faults += 1
            run.cluster.kill_actor(sub)
    elif kind is Kind.NODE:
        quiet_since = run.step_no - 30
        nodes = {
            node: names
            for node, names in run.cluster.live_nodes().items()
            if all(n in state.actors and n not in busy for n in names)
            and not any(
                f.kind in (Kind.CRASH, Kind.HANG) and f.step > quiet_since and f.actors & set(names)
                for f in run.ledger.faults
            )
        }
        if nodes:
            node = run.rng.choice(sorted(nodes))
            lost = run.cluster.lose_node(node)
            roles = {state.actors[n].role for n in lost}
            run.note(f"node loss {node}: {lost}")
            fault = run.ledger.add(kind, lost, run.step_no, roles)
            ranks_lost = [
                n for n in lost if state.actors[n].role == ELASTIC and state.actors[n].rank != SUB_MASTER_RANK
            ]
            fault.needs_count = SIMPLE in roles or not ranks_lost
            run.result.faults += 1
    elif kind is Kind.MARK and ranks:
        rank = state.actors[run.rng.choice(ranks)].rank
        rid = f"mark-{run.step_no}"
        names = m.debug.worker_names(ELASTIC, rank)
        run.ledger.add(kind, names, run.step_no)
        run.result.faults += 1
        run.note(f"mark-unhealthy {names} ({rid})")
        run.marks[rid] = names  # asked again of a rebuilt PrimeMaster (also one that died in it)
        if not adapter.mark_unhealthy(m, names, rid):
            raise Violation("commands", f"mark-unhealthy {rid} was refused the first time")
    elif kind is Kind.MASTER and adapter.synced(m) and not run.store.down:
        run.result.faults += 1
        run.rebuild("between commands")
    elif kind is Kind.MID and adapter.synced(m) and not run.store.down:
        run.crash.arm(run.rng.randint(1, 8), run.rng.random() < 0.5)
        run.note(f"PrimeMaster armed to die at I/O #{run.crash.left} (put applied: {run.crash.apply_put})")
    elif kind is Kind.STORE_HANG and not run.store.down:
        run.store.hang(run.clock() + run.rng.uniform(1, 25))
        run.note(f"store hangs until {run.store.down_until:.1f}")
    elif kind is Kind.STORE_KILL and not run.store.down:
        run.store.kill(run.clock() + run.rng.uniform(1, 15))
        run.note(f"store killed until {run.store.down_until:.1f}")
    elif kind is Kind.STORE_SLOW:
        run.store.delay_s = run.rng.choice((0.0, 0.0, 0.05, 0.5))
    elif kind is Kind.SCALE:
        role = run.rng.choice((ELASTIC, SIMPLE))
        size = run.rng.randint(1, 3) if role == ELASTIC else run.rng.randint(1, 4)
        send_scale(run, f"scale-{run.step_no}", role, size)
    elif kind is Kind.RETRY and run.requests:
        rid = run.rng.choice(sorted(run.requests))
        role, size, _ = run.requests[rid]
        send_scale(run, rid, role, size, retry=True)
    elif kind is Kind.STOP:
        run.note("dlu stop")
        adapter.request_stop(m, "stopped by user request")
