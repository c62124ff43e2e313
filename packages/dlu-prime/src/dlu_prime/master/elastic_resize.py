"""Elastic roles with a MIN:MAX range that resize while they run: the I/O around
`elastic_policy`'s rules, driven by the PrimeManager's loop.

- `intercept` (each monitoring pass): failures of a role's actors whose node may be lost are
  taken out of the pass; a node lost for good becomes one saved resize (`ResizeBegan`, cause
  "node lost"), not one failure per actor or per retry.
- `tick` (each loop turn): a node the role misses whose placement group Ray placed becomes a
  saved growth.
- `run` (from `ResizeRunner.resume`, also after a PrimeMaster restart): stop or drop the
  leaving nodes' actors, create and check the joining ones, then the role's SubMaster re-forms
  training around the new set in place (no restart of the actors that stay) and waits until
  the round at the new world is complete; `ResizeEnded` records the duration.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

from dlu_api.vocabulary import DEATH_KINDS, ActorStage, EventKind
from dlu_prime.master.changes import ActorsPlaced, Note
from dlu_prime.master.elastic_policy import (
    GROWN,
    NODE_LOST,
    LossVerdict,
    elastic_roles,
    forgiven_by_loss,
    grow_nodes,
    judge_loss,
    missing_nodes,
    role_nodes,
    unplaced_elastic,
)
from dlu_prime.master.lifecycle import EXIT_FAILED, FencedError, gone
from dlu_prime.master.monitor import Assessment
from dlu_prime.master.ports import StatePort
from dlu_prime.master.resize import FellBelowMin, ResizeBegan, ResizeEnded
from dlu_prime.master.state import SUB_MASTER_RANK, ResizeRecord
from dlu_prime.naming import sub_master_name
from dlu_prime.scheduler.base import ActorObservation, ActorSetupError, Scheduler, SchedulingError

logger = logging.getLogger(__name__)

REFORM_TIMEOUT_S = 120.0  # the new round at the new world: every rank stops and joins again


class SubMasterAway(Exception):
    """The role's SubMaster is dead or being rebuilt by Ray: the resize waits (stays in flight)
    until the failover ladder has set it up again, then goes on. Never a failed resize: a resize
    that failed here would hand healthy survivors to a role failover and a job restart."""


__all__ = ["ElasticResizer", "SubMasterAway", "unplaced_elastic"]


class ElasticResizer:
    def __init__(
        self,
        port: StatePort,
        scheduler: Scheduler,
        has_extension: Callable[[], bool],
        finish: Callable[[int, str], None],
        forget_liveness: Callable[[], None],
    ) -> None:
        self._port = port
        self._scheduler = scheduler
        self._has_extension = has_extension  # an Extension replaces lost nodes: no shrink
        self._finish = finish  # stop the job (below MIN past the wait)
        self._forget_liveness = forget_liveness
        self._gone_since: dict[str, float] = {}  # actor -> first pass it was seen gone
        self._noted: set[tuple[str, tuple[int, ...]]] = set()  # (role, lost nodes) said below MIN
        self._waiting: set[str] = set()  # roles whose resize waits for their SubMaster (said once)

    # detecting ---------------------------------------------------------------------------------
    def intercept(
        self, result: Assessment, observations: Mapping[str, ActorObservation], now: float
    ) -> Assessment:
        """Take the failures of possibly lost nodes out of this pass; begin a shrink for a node
        lost for good. Failures it does not hold go on to the failover ladder unchanged."""
        state = self._port.state()
        roles = elastic_roles(state)
        if not roles:
            return result
        down = {
            name
            for name, seen in observations.items()
            if name in state.actors
            and state.actors[name].rank != SUB_MASTER_RANK
            and (gone(seen) and not seen.reconstructed)
        }
        down |= {f.actor for f in result.failures if f.kind in DEATH_KINDS - {"restarted"}}
        self._gone_since = {n: self._gone_since.get(n, now) for n in down}
        if not down:
            self._noted.clear()
            return result
        nodes = {state.actors[n].node_id for n in down if n in state.actors} - {None}
        dead = self._scheduler.dead_nodes([n for n in nodes if n is not None]) if nodes else set[str]()
        held: set[str] = set()
        for spec in roles:
            mine = {n: t for n, t in self._gone_since.items() if state.actors[n].role == spec.name}
            verdict = self._judge(spec.name, mine, dead, now)
            held |= verdict.hold
            if verdict.stop is not None and verdict.culprit is not None:
                self._stop_below_min(spec.name, verdict, mine)
                return Assessment()
            if verdict.below_min is not None and (spec.name, verdict.lost) not in self._noted:
                self._noted.add((spec.name, verdict.lost))
                self._port.apply(Note(EventKind.ELASTIC_BELOW_MIN, verdict.below_min, spec.name))
            if verdict.shrink is not None:
                lost = ", ".join(f"node {k}" for k in verdict.lost)
                marked = any(state.actors[n].node_id in dead for n in verdict.shrink.removed)
                timeout = spec.elastic.replace_timeout_s if spec.elastic is not None else 0.0
                why = "Ray marked it dead" if marked else f"unplaceable for {timeout:g}s"
                joining = sorted({rank // spec.per_group for _, rank in verdict.shrink.added})
                placed = f"; node(s) {', '.join(map(str, joining))} placed" if joining else ""
                first_seen = min((mine[n] for n in verdict.shrink.removed if n in mine), default=now)
                forgiven = forgiven_by_loss(state, spec.name, first_seen, verdict.shrink.removed)
                self._port.apply(ResizeBegan(verdict.shrink, f"{NODE_LOST}: {lost}, {why}{placed}", forgiven))
                self._port.wake()
        if not held:
            return result
        kept = tuple(f for f in result.failures if f.actor not in held)
        return replace(result, failures=kept)

    def _judge(self, role: str, gone_since: Mapping[str, float], dead: set[str], now: float) -> LossVerdict:
        """`judge_loss`; below MIN, judged again with the missing nodes Ray placed meanwhile."""
        has_extension = self._has_extension()
        verdict = judge_loss(self._port.state(), role, gone_since, dead, now, has_extension)
        if verdict.below_min is None or verdict.shrink is not None:
            return verdict
        spec = self._port.state().spec.role(role)
        have = role_nodes(self._port.state(), role)
        free = [k for k in range(spec.total // spec.per_group) if k not in have]
        try:
            placed = self._scheduler.placed_nodes(role, free) if free else []
        except Exception:
            logger.exception("job %s: asking Ray for role %s's nodes failed", self._port.state().job, role)
            return verdict
        return (
            judge_loss(self._port.state(), role, gone_since, dead, now, has_extension, placed)
            if placed
            else verdict
        )

    def _stop_below_min(self, role: str, verdict: LossVerdict, gone_since: Mapping[str, float]) -> None:
        """Past the wait below MIN: the loss counted once on the lost node, then the job stops
        with what one node needs against what the cluster has free."""
        assert verdict.stop is not None and verdict.culprit is not None
        try:
            needs = self._scheduler.node_needs(role)
        except Exception:
            logger.exception(
                "job %s: asking Ray what role %s's nodes need failed", self._port.state().job, role
            )
            needs = ""
        reason = f"{verdict.stop}; {needs}" if needs else verdict.stop
        lost = [n for n in gone_since if self._port.state().actors[n].role == role]
        forgiven = forgiven_by_loss(self._port.state(), role, gone_since[verdict.culprit], lost)
        self._port.apply(FellBelowMin(role, verdict.culprit, verdict.below_min or verdict.stop, forgiven))
        self._finish(EXIT_FAILED, reason)

    def tick(self, now: float) -> None:
        """Begin a growth onto nodes Ray placed for a role below its target (rate-limited)."""
        state = self._port.state()
        judging = {state.actors[n].role for n in self._gone_since if n in state.actors}
        for spec in elastic_roles(state):
            missing = missing_nodes(state, spec.name)
            if not missing or state.resize is not None or spec.name in judging:
                continue  # a role whose actors are gone: `intercept` decides (with what Ray placed)
            record = state.roles.get(spec.name)
            last = record.last_resize_at if record is not None else None
            assert spec.elastic is not None
            if last is not None and now - last < spec.elastic.resize_interval_s:
                continue  # not even asking Ray: at most one automatic resize per interval
            try:
                placed = self._scheduler.placed_nodes(spec.name, missing)
            except Exception:
                logger.exception("job %s: asking Ray for role %s's nodes failed", state.job, spec.name)
                continue
            with self._port.lock:
                plan = grow_nodes(self._port.state(), spec.name, placed, now, last)
                if plan is not None:
                    joining = sorted({rank // spec.per_group for _, rank in plan.added})
                    self._port.apply(
                        ResizeBegan(plan, f"{GROWN}: node(s) {', '.join(map(str, joining))} placed")
                    )
            if plan is not None:
                return

    def pending(self) -> dict[str, int]:
        """Role -> nodes it still asks Ray for (`dlu status`'s pending capacity)."""
        state = self._port.state()
        return {r.name: len(missing_nodes(state, r.name)) for r in elastic_roles(state)}

    # acting ------------------------------------------------------------------------------------
    def run(self, record: ResizeRecord) -> None:
        """Carry out the saved elastic resize; `ResizeEnded` on every path."""
        error: str | None = None
        try:
            self._carry_out(record)
        except FencedError:
            raise
        except SubMasterAway as exc:
            if record.role not in self._waiting:
                self._waiting.add(record.role)
                why = f"resize of role {record.role} waits: {exc}; it goes on once the SubMaster is set up again"
                self._port.apply(Note(EventKind.RESIZE_WAITING, why, record.role))
            return
        except Exception as exc:
            error = f"{type(exc).__name__}: {exc}"
            logger.exception("job %s: elastic resize of role %s failed", self._port.state().job, record.role)
            if record.added:
                try:
                    self._scheduler.remove_actors(list(record.added))
                except Exception:
                    logger.exception(
                        "job %s: removing the actors of a failed resize failed", self._port.state().job
                    )
        self._waiting.discard(record.role)
        for name in record.removed:
            self._gone_since.pop(name, None)
        self._port.apply(ResizeEnded(error))
        self._forget_liveness()
        if error is not None and record.removed and record.cause.startswith(NODE_LOST):
            # the survivors could not re-form: the failover ladder takes over (the role restarts)
            self._port.apply(Note(EventKind.ELASTIC_REFORM_FAILED, error, record.role))

    def _carry_out(self, record: ResizeRecord) -> None:
        state = self._port.state()
        spec = state.spec.role(record.role)
        assert spec.elastic is not None
        per = spec.per_group
        if record.removed:
            if record.cause.startswith(NODE_LOST):
                self._scheduler.drop_actors(list(record.removed))  # gone with their node: no stop call
            else:
                leaving = sorted({state.actors[n].rank // per for n in record.removed if n in state.actors})
                self._scheduler.remove_actors(list(record.removed))
                self._scheduler.remove_node_groups(record.role, leaving)
        added_ranks = [state.actors[n].rank for n in record.added]
        joining = sorted({r // per for r in added_ranks})
        if joining:
            placed = self._scheduler.placed_nodes(record.role, joining, wait_s=spec.elastic.start_timeout_s)
            if set(placed) != set(joining):
                raise SchedulingError(
                    f"node(s) {', '.join(str(k) for k in joining if k not in placed)} of role {record.role} "
                    f"could not be placed in {spec.elastic.start_timeout_s:g}s (elastic.start_timeout_s)"
                )
            waiting = [n for n in record.added if state.actors[n].stage is ActorStage.INIT]
            if waiting:
                nodes = self._scheduler.add_actors(
                    record.role, [state.actors[n].rank for n in waiting], (record.nodes or 0) * per
                )
                self._port.apply(ActorsPlaced(nodes, ActorStage.READY, fresh=True))
        sub = sub_master_name(state.job, record.role)
        unchecked = [r for r in added_ranks if r not in record.checked]
        if unchecked:
            self._call_sub(
                sub, "check_nodes", unchecked, timeout_s=spec.elastic.node_check.timeout_s * 3 + 60
            )
            with self._port.lock:  # saved: a PrimeMaster rebuilt from here on does not check them again
                record.checked = sorted({*record.checked, *unchecked})
                self._port.save()
        elif added_ranks:
            logger.info(
                "job %s: the new node(s) of role %s passed their check already", state.job, record.role
            )
        leaving_names = set(record.removed)
        ranks = sorted(
            a.rank
            for n, a in state.actors.items()
            if a.role == record.role and a.rank != SUB_MASTER_RANK and n not in leaving_names
        )
        world = self._call_sub(
            sub,
            "resize_members",
            ranks,
            [state.actors[n].rank for n in record.added],
            REFORM_TIMEOUT_S,
            timeout_s=REFORM_TIMEOUT_S + 30,
        )
        if world is None:
            raise RuntimeError(
                f"training of role {record.role} did not re-form at {len(ranks)} rank(s) in {REFORM_TIMEOUT_S:g}s"
            )
        logger.info(
            "job %s: role %s trains at world %s (%d rank(s))", state.job, record.role, world, len(ranks)
        )

    def _call_sub(self, sub: str, method: str, *args: Any, timeout_s: float) -> Any:
        """Call the role's SubMaster, which must be the set-up incarnation: one that is dead, being
        rebuilt by Ray, or rebuilt and not set up yet (it died with the lost node, or on its own)
        raises `SubMasterAway`, before the call or when the call failed because of it."""
        self._sub_ready(sub)
        try:
            return self._scheduler.call(sub, method, *args, timeout_s=timeout_s)
        except ActorSetupError:
            self._sub_ready(sub)
            raise

    def _sub_ready(self, sub: str) -> None:
        seen = self._scheduler.poll([sub]).get(sub)
        if seen is None or gone(seen) or seen.unavailable:
            error = (seen.error if seen is not None else None) or "not answering"
            raise SubMasterAway(f"its SubMaster {sub} is dead or being rebuilt by Ray ({error})")
