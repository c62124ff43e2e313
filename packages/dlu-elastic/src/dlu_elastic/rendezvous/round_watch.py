"""Held calls of the ElasticService: a rendezvous call waits on the server's event loop until
its round completes (a long poll), woken by the rendezvous's listener, not by polling threads.

Thousands of calls are held at once (every agent of a round), so a held call costs one future
and one list entry, nothing per call on the loop's timer heap: held calls are grouped by the
slot of `RECHECK_S` their deadline falls in, and one timer per slot answers them. A call is
therefore answered at most `RECHECK_S` before its deadline, never after it.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from typing import TypeVar

from dlu_elastic.rendezvous.state import Rendezvous

RECHECK_S = 0.05  # while calls are held, the grace period is re-evaluated this often; deadline slot

_T = TypeVar("_T")


class RoundWatch:
    """Wakes held calls when a round completes or moves on. Lives on the server's loop.

    The rendezvous calls `_notify` from any thread, under its lock; the news reaches the loop
    through `call_soon_threadsafe`, where it resolves the future of every held call. While
    calls are held, one ticker refreshes the rendezvous so a grace period that runs out is seen.
    """

    def __init__(self, rendezvous: Rendezvous, loop: asyncio.AbstractEventLoop) -> None:
        self._rendezvous = rendezvous
        self._loop = loop
        # deadline slot -> futures of the calls held until then; a slot has a timer while listed
        self._slots: dict[int, list[asyncio.Future[None]]] = {}
        self._held = 0
        self._ticker: asyncio.Task[None] | None = None
        self._released = False
        self.remove = rendezvous.add_listener(self._notify)

    @property
    def held(self) -> int:
        """How many calls are held now (read from any thread: tests and debugging)."""
        return self._held

    def wake(self) -> None:
        """Have every held call check again (something besides the rounds changed). Any thread."""
        self._notify()

    def release(self) -> None:
        """Answer every held call now, and any call from now on at once, with what it has (the
        server is stopping: its grace period is for calls being served, not for long polls,
        which every rank has one of). On the loop."""
        self._released = True
        self._fire()

    def _notify(self) -> None:
        with contextlib.suppress(RuntimeError):  # a closed loop: the server is gone, nobody is held
            self._loop.call_soon_threadsafe(self._fire)

    def _fire(self) -> None:
        """A change: wake every held call (each checks again and, if still waiting, re-enlists)."""
        for slot, waiters in self._slots.items():
            if waiters:
                self._slots[slot] = []
                _wake(waiters)

    def _expire(self, slot: int) -> None:
        _wake(self._slots.pop(slot, []))

    async def until(self, ready: Callable[[], _T | None], timeout_s: float) -> _T | None:
        """`ready()`'s first non-None answer, checked now and after every change; None when
        `timeout_s` passes first (answered up to RECHECK_S early). Exceptions of `ready()`
        propagate."""
        loop = self._loop
        slot = int((loop.time() + timeout_s) / RECHECK_S)
        answer_at = slot * RECHECK_S  # the start of the deadline's slot: never after the deadline
        self._held += 1
        if self._ticker is None:
            self._ticker = loop.create_task(self._tick())
        try:
            while True:
                found = ready()
                if found is not None or self._released or loop.time() >= answer_at:
                    return found
                waiters = self._slots.get(slot)
                if waiters is None:
                    waiters = self._slots[slot] = []
                    loop.call_at(answer_at, self._expire, slot)
                woken = loop.create_future()
                waiters.append(woken)
                await woken  # a change or the slot's timer; a cancelled call cancels only its own
        finally:
            self._held -= 1

    def close(self) -> None:
        """Stop hearing from the rendezvous and stop the ticker (on the loop, at shutdown). Calls
        still held are answered by their slots' timers (the server cancels them when it stops)."""
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


def _wake(waiters: list[asyncio.Future[None]]) -> None:
    for woken in waiters:
        if not woken.done():  # a held call cancelled meanwhile (its client went away)
            woken.set_result(None)
