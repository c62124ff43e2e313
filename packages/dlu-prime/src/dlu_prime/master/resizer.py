"""`dlu scale`'s side of the PrimeMaster, thin I/O around the decision core's resize chain
(`core/resize_chain.py`): a request is decided and saved in flight on the caller's thread
(`ScaleRequested`: `resize_started` shows at once), the PrimeManager's loop carries it out
(`ResizeDue`, also one a previous PrimeMaster began), and a caller waits for its end here.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from dlu_prime.master.core.events import Event, ResizeDue, ScaleRequested
from dlu_prime.master.core.resize_chain import request_seen
from dlu_prime.master.ports import StatePort
from dlu_prime.master.resize import ResizePlan
from dlu_prime.master.state import RequestOutcome, ResizeRecord


class ResizeRunner:
    def __init__(self, port: StatePort, handle: Callable[[Event], Any]) -> None:
        self._port = port
        self._handle = handle  # the PrimeManager's loop: event -> decide -> apply -> execute
        self._done = threading.Condition()

    def request(
        self, role: str, size: int, cause: str = "dlu scale", request_id: str | None = None
    ) -> ResizePlan:
        """Decide and save a resize in flight, then wake the loop that runs it. The size the
        role has already: nothing saved or counted (a retried `dlu scale` is harmless).
        `request_id` is saved with the resize, so a retry of the request finds it (`known`).

        Raises:
            ScaleError: refused (the message names the value and the fix); nothing changed.
        """
        plan: ResizePlan = self._handle(ScaleRequested(role, size, cause, request_id))
        return plan

    def known(self, request_id: str) -> RequestOutcome | ResizeRecord | None:
        """A request seen before: its outcome, or its resize still in flight; None if new."""
        with self._port.lock:
            return request_seen(self._port.state(), request_id)

    def wait(self, timeout_s: float) -> bool:
        """Whether no resize is in flight, waiting up to `timeout_s` for the current one."""
        with self._done:
            return self._done.wait_for(lambda: self._port.state().resize is None, timeout_s)

    def resume(self) -> None:
        """Carry the saved in-flight resize out (it ends, or waits for its SubMaster)."""
        if self._port.state().resize is None:
            return
        try:
            self._handle(ResizeDue())
        finally:
            with self._done:
                self._done.notify_all()
