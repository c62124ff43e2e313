"""Whether an effect is caused by a fault in flight: by cause, never by a time window.

One fault is one recovery, counted once on its culprit. A rank whose collective fails because a
peer died, and the actors that went down with a lost node, are that fault's effects: they join
its recovery and are not counted again. Anything else that happens meanwhile (a hang, a crash of
a process of its own) is a fault of its own: counted once on its own culprit and visible on the
timeline, even when the recovery in flight happens to recover it too.

The rules (docs/failover.md, "Causality"):

1. An effect joins a fault in flight only when it reports that fault: its error reads as a
   collective that failed because a peer left (`is_peer_failure`), or a peer of its role is dead,
   and it says so; or its own actor is one the recovery replaces, or is on the lost node.
2. A report whose error is the rank's own (an exception, an exit code, a signal, a hang found by
   its agent) is never an effect of another rank's fault, whatever else is going on.
3. A node loss forgives only the in-place restarts it caused: those of ranks on the lost node,
   and those whose report reads as the lost peer's effect; never a crash of its own that merely
   happened close to it.

Pure: no I/O, no clock of its own.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Iterable
from dataclasses import dataclass

# Errors a rank raises because another rank went away, not because of its own fault.
_PEER_ERRORS = re.compile(
    "|".join(
        (
            r"Connection closed by peer",
            r"Connection reset by peer",
            # A round formed just before a node loss: the survivors' processes connect to a
            # peer whose node is gone (seen: gloo's pair connect in the overlap test, defect 3).
            r"Connection refused",
            r"Broken pipe",
            r"remote process exited",
            r"ncclRemoteError",
            r"NCCL communicator was aborted",
            r"DistNetworkError",
            r"recvBytes? failed",
            r"sendBytes? failed",
            r"Socket Timeout",
        )
    ),
    re.IGNORECASE,
)


def is_peer_failure(error: str) -> bool:
    """True when `error` reads as a collective that failed because a peer left."""
    return bool(_PEER_ERRORS.search(error))


@dataclass(frozen=True)
class Report:
    """What a rank's agent reported: who, and the error it saw."""

    agent: str | None
    error: str


@dataclass(frozen=True)
class FaultInFlight:
    """A fault being recovered: the actors its recovery replaces, and the nodes it lost."""

    actors: frozenset[str]
    lost_nodes: frozenset[str] = frozenset()


def effect_of(
    report: Report, fault: FaultInFlight | None, dead_peers: Collection[str], node_of: dict[str, str | None]
) -> bool:
    """Whether `report` is an effect of `fault` (or of the death of one of `dead_peers`), so it
    joins that recovery uncounted; False means a fault of its own (rules 1 and 2)."""
    agent = report.agent
    if fault is not None and agent is not None:
        if agent in fault.actors:
            return True  # its own actor is being replaced: its process went with it
        node = node_of.get(agent)
        if node is not None and node in fault.lost_nodes:
            return True  # on the lost node
    if not is_peer_failure(report.error):
        return False  # an error of its own: never another rank's effect
    return fault is not None or any(peer != agent for peer in dead_peers)


def caused_by_loss(
    restarts: Iterable[tuple[str | None, str | None, str]],
    lost_actors: Collection[str],
    lost_nodes: Collection[str],
) -> int:
    """How many of these counted in-place restarts (culprit actor, its node, message) the loss
    of `lost_actors` on `lost_nodes` caused (rule 3): a rank on the lost node, or a report that
    reads as the lost peer's effect. A crash of its own is never forgiven."""
    return sum(
        1
        for actor, node, message in restarts
        if (actor is not None and actor in lost_actors)
        or (node is not None and node in lost_nodes)
        or is_peer_failure(message)
    )
