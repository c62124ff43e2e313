"""The fault kinds the simulation injects, and the seeded choice of the next one.

One action per step, before the manager's turn: a fault of the cluster, the store or the
PrimeMaster, or a user's command. Death faults (actor kill, node loss, SubMaster kill,
mark-unhealthy) are at most one per monitoring pass, so each has one recovery to be counted on.
"""

from __future__ import annotations

import random
from enum import StrEnum


class Kind(StrEnum):
    NOTHING = "nothing"
    CRASH = "crash"  # a rank's training process exits (its agent reports it: in place)
    HANG = "hang"  # a rank's training step is stuck (its agent kills it and reports it)
    KILL = "actor_kill"  # an actor's process dies; Ray reconstructs it
    NODE = "node_loss"  # a node and every actor on it, for good
    SUB = "sub_master_kill"  # the ElasticMaster dies; Ray reconstructs it
    MASTER = "master_kill"  # the PrimeMaster dies between commands
    MID = "master_kill_mid"  # the PrimeMaster dies inside a scheduler call or store write
    STORE_HANG = "store_hang"
    STORE_KILL = "store_kill"
    STORE_SLOW = "store_slow"
    SCALE = "scale"  # `dlu scale` with a request id
    RETRY = "scale_retry"  # the same `dlu scale` request sent again
    STOP = "stop"  # `dlu stop`
    MARK = "mark_unhealthy"  # `dlu debug mark-unhealthy` with a request id


DEATHS = frozenset({Kind.KILL, Kind.NODE, Kind.SUB, Kind.MARK})
"""Faults the failover ladder (or the elastic resize) counts on a culprit actor."""

WEIGHTS: dict[Kind, float] = {
    Kind.NOTHING: 30,
    Kind.CRASH: 6,
    Kind.HANG: 4,
    Kind.KILL: 5,
    Kind.NODE: 2,
    Kind.SUB: 2,
    Kind.MASTER: 2,
    Kind.MID: 4,
    Kind.STORE_HANG: 2,
    Kind.STORE_KILL: 1,
    Kind.STORE_SLOW: 1,
    Kind.SCALE: 4,
    Kind.RETRY: 2,
    Kind.STOP: 0.3,
    Kind.MARK: 2,
}

_KINDS = list(WEIGHTS)
_CUMULATIVE = [sum(list(WEIGHTS.values())[: i + 1]) for i in range(len(_KINDS))]

OWN_CRASH = (
    "training process exited with code -9",
    "Traceback (most recent call last):\nexit code -9 (SIGKILL)",
)
OWN_HANG = ("training step stuck at 20 for 8.0s; killing it", "no step for 8.0s (hang)")
PEER_EFFECT = (
    "training process failed",
    "Traceback (most recent call last):\nRuntimeError: Connection reset by peer",
)


def pick(rng: random.Random) -> Kind:
    return rng.choices(_KINDS, cum_weights=_CUMULATIVE)[0]
