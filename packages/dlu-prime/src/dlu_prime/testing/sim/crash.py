"""Killing the PrimeMaster in the middle of a command: a BaseException raised from inside a
scheduler call or a store write, so the manager unwinds mid-action as a SIGKILLed process stops."""

from __future__ import annotations

from collections.abc import Callable


class MasterKilled(BaseException):
    """The PrimeMaster process died here (not an Exception: no `except Exception` catches it)."""


class CrashPoint:
    """Armed with a countdown of I/O operations (scheduler calls and store puts): the one that
    brings it to zero raises `MasterKilled`; a put may first be applied ("after") or not."""

    def __init__(self) -> None:
        self.left: int | None = None
        self.apply_put = False  # a put at the crash point lands before the process dies
        self.fired: str | None = None  # where it fired, for the trace
        self.allowed: Callable[[], bool] = lambda: True  # whether the process may die now

    def arm(self, after_ops: int, apply_put: bool) -> None:
        self.left = after_ops
        self.apply_put = apply_put
        self.fired = None

    def disarm(self) -> None:
        self.left = None

    def tick(self, where: str) -> bool:
        """Count one operation; True when this one is where the master dies."""
        if self.left is None or not self.allowed():
            return False
        self.left -= 1
        if self.left > 0:
            return False
        self.left = None
        self.fired = where
        return True

    def maybe_die(self, where: str) -> None:
        if self.tick(where):
            raise MasterKilled(where)
