"""Interrupts of a command that follows a job (`dlu run`, `dlu resume`).

The first Ctrl-C stops the job cleanly; a second one stops it at once (its actors are killed
rather than waited for). The work after that (recording the job's end, shutting an embedded
Ray down) must not be cut short by a third one, or the job's record would stay STOPPING:
while it runs, interrupts only print a note. SIGTERM (`kill PID`) counts as a Ctrl-C.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Generator
from contextlib import contextmanager
from types import FrameType

EXIT_INTERRUPTED = 130  # 128 + SIGINT, what shells report for a command ended by Ctrl-C
_SIGNALS = (signal.SIGINT, signal.SIGTERM)


@contextmanager
def terminate_as_interrupt() -> Generator[None]:
    """While the block runs, SIGTERM raises KeyboardInterrupt as Ctrl-C does."""
    previous = signal.getsignal(signal.SIGTERM)
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous if previous is not None else signal.SIG_DFL)


@contextmanager
def shielded(note: str) -> Generator[None]:
    """While the block runs, SIGINT and SIGTERM print `note` on stderr instead of interrupting.
    (SIGKILL still ends the process; what a local run started dies with it.)"""

    def tell(signum: int, frame: FrameType | None) -> None:
        del signum, frame
        os.write(2, f"{note}\n".encode())  # not through sys.stderr: the handler may run inside a write

    previous = {signum: signal.getsignal(signum) for signum in _SIGNALS}
    for signum in _SIGNALS:
        signal.signal(signum, tell)
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler if handler is not None else signal.SIG_DFL)
