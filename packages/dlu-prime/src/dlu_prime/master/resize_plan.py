"""The plain data a resize is decided with, below both resize policies (`resize` for simple
roles, `elastic_policy` for MIN:MAX ones) so neither imports the other's types back."""

from __future__ import annotations

from dataclasses import dataclass

AUTOSCALE = "autoscale"  # the cause of a resize auto-scaling decided (master/core/autoscale_pass.py)
SETS_TARGET = ("dlu scale", AUTOSCALE)
"""Causes after which an elastic role keeps the node count they set (no growth back to MAX)."""


class ScaleError(ValueError):
    """A resize request that is refused; the message names the value and the fix."""


class SubMasterAway(Exception):
    """The role's SubMaster is dead or being rebuilt by Ray: the resize waits (stays in flight)
    until the failover ladder has set it up again, then goes on. Never a failed resize: a resize
    that failed here would hand healthy survivors to a role failover and a job restart."""


@dataclass(frozen=True)
class ResizePlan:
    """What one resize does: actors to create (name, rank) and actors to stop, highest rank first."""

    role: str
    old_size: int
    new_size: int
    added: tuple[tuple[str, int], ...] = ()
    removed: tuple[str, ...] = ()
    nodes: int | None = None  # an elastic role's node count after it (sizes are node counts)


@dataclass(frozen=True)
class StartedWithout:
    """Elastic roles start with the nodes Ray placed: the other nodes' actors are not created
    (their placement groups stay asked for, and the role grows onto them when placed)."""

    names: tuple[str, ...]
    message: str
