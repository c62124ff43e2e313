"""Elastic roles with a MIN:MAX range, the PrimeMaster's side: what it observes, nothing it
decides. The decisions (a node lost for good becomes one saved shrink, growth onto nodes Ray
placed, the wait below MIN and its stop) are the decision core's (`core/elastic_chain.py`),
carried out by its resize chain (`core/resize_chain.py`).

- `watch` (each monitoring pass): since when each elastic role's worker has been seen gone or
  dead, the input of the pass's loss judgement (`PassObserved.gone_since`).
- `tick` (each loop turn): asks the core to grow roles below their target (`GrowthDue`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from dlu_api.vocabulary import DEATH_KINDS
from dlu_prime.master.core.events import Event, GrowthDue
from dlu_prime.master.elastic_policy import elastic_roles, missing_nodes, unplaced_elastic
from dlu_prime.master.lifecycle import gone
from dlu_prime.master.monitor import Assessment
from dlu_prime.master.ports import StatePort
from dlu_prime.master.resize_plan import SubMasterAway
from dlu_prime.master.state import SUB_MASTER_RANK
from dlu_prime.scheduler.base import ActorObservation

__all__ = ["ElasticResizer", "SubMasterAway", "unplaced_elastic"]


class ElasticResizer:
    def __init__(self, port: StatePort, handle: Callable[[Event], Any]) -> None:
        self._port = port
        self._handle = handle
        self._gone_since: dict[str, float] = {}  # actor -> first pass it was seen gone

    def watch(
        self, result: Assessment, observations: Mapping[str, ActorObservation], now: float
    ) -> dict[str, float]:
        """Elastic roles' workers gone (not rebuilt) or dead this pass -> since when."""
        state = self._port.state()
        if not elastic_roles(state):
            return {}
        down = {
            name
            for name, seen in observations.items()
            if name in state.actors
            and state.actors[name].rank != SUB_MASTER_RANK
            and (gone(seen) and not seen.reconstructed)
        }
        down |= {f.actor for f in result.failures if f.kind in DEATH_KINDS - {"restarted"}}
        self._gone_since = {n: self._gone_since.get(n, now) for n in down}
        return dict(self._gone_since)

    def tick(self, now: float) -> None:
        """Begin a growth onto nodes Ray placed for a role below its target (rate-limited)."""
        del now  # decided on the loop's clock
        state = self._port.state()
        if not elastic_roles(state):
            return
        judging = frozenset(state.actors[n].role for n in self._gone_since if n in state.actors)
        self._handle(GrowthDue(judging))

    def pending(self) -> dict[str, int]:
        """Role -> nodes it still asks Ray for (`dlu status`'s pending capacity)."""
        state = self._port.state()
        return {r.name: len(missing_nodes(state, r.name)) for r in elastic_roles(state)}
