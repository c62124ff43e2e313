"""The chaos campaign's plan: which fault, on what, and when, as a pure function of the seed.

A plan is reproducible: the same (seed, duration, fault count, kinds) always gives the same
list, so a failing campaign can be run again exactly. Times are seconds after training first
ran; the runner injects each fault at its time or, if the previous recovery is still going on,
as soon as it has finished (faults are spaced, except the two deliberately overlapping kinds).
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum


class FaultKind(StrEnum):
    """Every fault the campaign injects. The value is what the CLI's --kinds takes."""

    PROC_CRASH = "proc_crash"  # SIGKILL of one rank's training process
    PROC_HANG = "proc_hang"  # SIGSTOP of one rank's training process
    WORKER_KILL = "worker_kill"  # SIGKILL of one rank's ElasticWorker actor
    ELASTIC_MASTER_KILL = "elastic_master_kill"  # SIGKILL of the ElasticMaster while training
    ELASTIC_MASTER_NODE_CHECK = "elastic_master_node_check"  # ... while it runs the node check
    PRIME_MASTER_KILL = "prime_master_kill"  # SIGKILL of the PrimeMaster
    PRIME_MASTER_TWICE = "prime_master_twice"  # killed, and killed again as soon as it is back
    PRIME_MASTER_IN_FAILOVER = "prime_master_in_failover"  # worker killed, then the PrimeMaster mid-failover
    NODE_REMOVAL = "node_removal"  # a Ray node of the trainer removed (and replaced)
    PRODUCER_KILL = "producer_kill"  # SIGKILL of the pipeline's producer actor
    CONSUMER_KILL = "consumer_kill"  # SIGKILL of one of the pipeline's consumer actors

    @property
    def injections(self) -> int:
        """How many faults one planned item injects (the overlapping kinds inject two)."""
        return 2 if self in (FaultKind.PRIME_MASTER_TWICE, FaultKind.PRIME_MASTER_IN_FAILOVER) else 1

    @property
    def pipeline(self) -> bool:
        """Injected into the pipeline job rather than the training job."""
        return self in (FaultKind.PRODUCER_KILL, FaultKind.CONSUMER_KILL)


TRAINING_KINDS = tuple(k for k in FaultKind if not k.pipeline)
PIPELINE_KINDS = tuple(k for k in FaultKind if k.pipeline)
RANKED = frozenset({FaultKind.PROC_CRASH, FaultKind.PROC_HANG, FaultKind.WORKER_KILL})


@dataclass(frozen=True)
class Planned:
    """One planned fault: `at` seconds after training started; `target` a rank, a node index
    (node removal) or a consumer index, None where the kind has one target."""

    at: float
    kind: FaultKind
    target: int | None = None


@dataclass(frozen=True)
class Shape:
    """What the targets are drawn from: ranks of the trainer, its nodes, the pipeline's consumers."""

    ranks: int = 4
    nodes: int = 2
    consumers: int = 2


def parse_kinds(text: str) -> tuple[FaultKind, ...]:
    """'all', or a comma-separated list of FaultKind values.

    Raises:
        ValueError: an unknown kind, naming the known ones.
    """
    if text.strip() in ("", "all"):
        return tuple(FaultKind)
    kinds: list[FaultKind] = []
    for raw in text.split(","):
        name = raw.strip()
        try:
            kinds.append(FaultKind(name))
        except ValueError:
            known = ", ".join(k.value for k in FaultKind)
            raise ValueError(f"--kinds: unknown fault kind {name!r}; use 'all' or some of: {known}") from None
    return tuple(dict.fromkeys(kinds))


def schedule(
    seed: int | str,
    duration_s: float,
    faults: int,
    kinds: Sequence[FaultKind],
    shape: Shape = Shape(),
    *,
    start_s: float = 5.0,
    tail_s: float = 0.0,
    min_gap_s: float = 5.0,
) -> list[Planned]:
    """At least `faults` injections of `kinds`, every kind once before any repeats, spread over
    [start_s, duration_s - tail_s] in random order, one per time slot.

    ELASTIC_MASTER_NODE_CHECK, if asked for, comes once, at 0: the node check runs before
    training. The overlapping kinds count two injections each.

    Raises:
        ValueError: no kinds, a fault count below 1, or slots shorter than `min_gap_s`
            (the message says which argument to change).
    """
    if not kinds:
        raise ValueError("kinds: no fault kind to plan; pass at least one (or 'all')")
    if faults < 1:
        raise ValueError(f"faults: {faults} < 1; ask for at least one fault")
    rng = random.Random(seed)
    wanted = list(dict.fromkeys(kinds))
    at_start = FaultKind.ELASTIC_MASTER_NODE_CHECK in wanted
    timed = [k for k in wanted if k is not FaultKind.ELASTIC_MASTER_NODE_CHECK]
    budget = faults - (1 if at_start else 0)
    order: list[FaultKind] = []
    if timed:
        first = timed[:]
        rng.shuffle(first)
        for kind in first:
            if budget <= 0:
                break
            order.append(kind)
            budget -= kind.injections
        while budget > 0:
            kind = rng.choice(timed)
            order.append(kind)
            budget -= kind.injections
        rng.shuffle(order)
    plan = [Planned(0.0, FaultKind.ELASTIC_MASTER_NODE_CHECK)] if at_start else []
    if not order:
        return plan
    span = duration_s - tail_s - start_s
    slot = span / len(order)
    if slot < min_gap_s:
        raise ValueError(
            f"duration: {len(order)} faults in {span:.0f} s leave {slot:.1f} s each, under the "
            f"{min_gap_s:g} s a recovery needs; make the run longer or ask for fewer faults"
        )
    for index, kind in enumerate(order):
        at = start_s + slot * (index + rng.uniform(0.0, 0.5))
        plan.append(Planned(round(at, 3), kind, _target(kind, shape, rng)))
    return plan


def _target(kind: FaultKind, shape: Shape, rng: random.Random) -> int | None:
    if kind in RANKED or kind is FaultKind.PRIME_MASTER_IN_FAILOVER:
        return rng.randrange(shape.ranks)
    if kind is FaultKind.NODE_REMOVAL:
        return rng.randrange(shape.nodes)
    if kind is FaultKind.CONSUMER_KILL:
        return rng.randrange(shape.consumers)
    return None


def injections(plan: Sequence[Planned]) -> int:
    """How many faults the plan injects in all."""
    return sum(p.kind.injections for p in plan)
