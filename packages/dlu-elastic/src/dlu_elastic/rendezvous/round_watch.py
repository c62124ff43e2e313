"""Held calls of the ElasticService: a rendezvous call waits on the server's event loop until
its round completes (a long poll), woken by the rendezvous's listener, not by polling threads.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from typing import TypeVar

from dlu_elastic.rendezvous.state import Rendezvous

RECHECK_S = 0.05  # while calls are held, the grace period is re-evaluated this often

_T = TypeVar("_T")


class RoundWatch:
    """Wakes held calls when a round completes or moves on. Lives on the server's loop.

    The rendezvous calls `_notify` from any thread, under its lock; the news reaches the loop
    through `call_soon_threadsafe`, where one event per change wakes every held call. While
    calls are held, one ticker refreshes the rendezvous so a grace period that runs out is seen.
    """

    def __init__(self, rendezvous: Rendezvous, loop: asyncio.AbstractEventLoop) -> None:
        self._rendezvous = rendezvous
        self._loop = loop
        self._event = asyncio.Event()
        self._held = 0
        self._ticker: asyncio.Task[None] | None = None
        self.remove = rendezvous.add_listener(self._notify)

    @property
    def held(self) -> int:
        """How many calls are held now (read from any thread: tests and debugging)."""
        return self._held

    def wake(self) -> None:
        """Have every held call check again (something besides the rounds changed). Any thread."""
        self._notify()

    def _notify(self) -> None:
        with contextlib.suppress(RuntimeError):  # a closed loop: the server is gone, nobody is held
            self._loop.call_soon_threadsafe(self._fire)

    def _fire(self) -> None:
        self._event.set()
        self._event = asyncio.Event()

    async def until(self, ready: Callable[[], _T | None], timeout_s: float) -> _T | None:
        """`ready()`'s first non-None answer, checked now and after every change; None when
        `timeout_s` passes first. Exceptions of `ready()` propagate."""
        deadline = self._loop.time() + timeout_s
        self._held += 1
        if self._ticker is None:
            self._ticker = self._loop.create_task(self._tick())
        try:
            while True:
                event = self._event  # taken before the check: a change after it sets this event
                found = ready()
                remaining = deadline - self._loop.time()
                if found is not None or remaining <= 0:
                    return found
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(remaining):  # no task per wait, unlike wait_for
                        await event.wait()
        finally:
            self._held -= 1

    def close(self) -> None:
        """Stop hearing from the rendezvous and stop the ticker (on the loop, at shutdown)."""
        self.remove()
        if self._ticker is not None:
            self._ticker.cancel()

    async def _tick(self) -> None:
        try:
            while self._held:
                await asyncio.sleep(RECHECK_S)
                self._rendezvous.refresh()
        finally:
            self._ticker = None
