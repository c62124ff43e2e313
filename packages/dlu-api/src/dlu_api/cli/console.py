"""What `dlu run` shows while it follows a job: a live view in a terminal (`LiveConsole`), one
plain line per change and event elsewhere (`PlainConsole`: logs, pipes, CI), as before.

Both are fed each status the client sees and shown the final one at the end. rich is imported
only for the live view: a `dlu run` into a pipe does not pay for it.
"""

from __future__ import annotations

import os
import sys
import time
import warnings
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

from dlu_api.cli.console_model import ConsoleModel
from dlu_api.cli.render import ProgressPrinter, status_text
from dlu_api.client.local import VERBOSE_ENV as VERBOSE_ENV  # where `--verbose` is read from
from dlu_api.status import JobStatus

if TYPE_CHECKING:
    from rich.console import Console
    from rich.live import Live


def quiet_python_warnings() -> None:
    """Python warnings Ray's modules raise in this process are not shown (`--verbose` shows
    them); the embedded Ray's own logging is quieted where it starts (`QUIET_RAY_OPTIONS`)."""
    warnings.filterwarnings("ignore", module=r"ray(\.|$)")


class JobConsole(Protocol):
    def __call__(self, status: JobStatus) -> None: ...

    def stop(self) -> None:
        """Stop redrawing (safe to call twice, and before anything was drawn)."""
        ...

    def close(self, final: JobStatus, tracebacks: bool = True) -> None:
        """Show the job's final status (`tracebacks` False: one line per failure message, its
        traceback having been printed from the rank's stderr)."""
        ...


class PlainConsole:
    """One line per stage change, role change and event, then the final status as text."""

    def __init__(self, emit: Callable[[str], None]) -> None:
        self._emit = emit
        self._printer = ProgressPrinter(emit)

    def __call__(self, status: JobStatus) -> None:
        self._printer(status)

    def stop(self) -> None:
        return None

    def close(self, final: JobStatus, tracebacks: bool = True) -> None:
        self._printer(final)
        self._emit(status_text(final, events=0, tracebacks=tracebacks))


class LiveConsole:
    """A screen redrawn as statuses come: stage, roles, restarts, failures and recoveries.

    Started on the first status, so what is printed before the job starts (a refusal) is plain;
    whatever else writes to stdout or stderr meanwhile (`--verbose`, an interrupt's note) is
    printed above the screen. The final screen stays in the terminal.
    """

    def __init__(self, console: Console | None = None, clock: Callable[[], float] = time.monotonic) -> None:
        from rich.console import Console

        self._console = console or Console()
        self._model = ConsoleModel()
        self._clock = clock
        self._live: Live | None = None

    def _draw(self, status: JobStatus) -> None:
        from rich.live import Live

        from dlu_api.cli.console_view import render

        screen = render(self._model.update(status, self._clock()))
        if self._live is None:
            # Redrawn when a status comes (twice a second), not by a thread of its own.
            self._live = Live(screen, console=self._console, auto_refresh=False, transient=True)
            self._live.start(refresh=True)
        else:
            self._live.update(screen, refresh=True)

    def __call__(self, status: JobStatus) -> None:
        self._draw(status)

    def stop(self) -> None:
        if self._live is not None:
            self._live.stop()
            self._live = None

    def close(self, final: JobStatus, tracebacks: bool = True) -> None:
        from dlu_api.cli.console_view import render

        self.stop()
        self._console.print(render(self._model.update(final, self._clock()), tracebacks))


def stdout_is_terminal() -> bool:
    try:
        return sys.stdout.isatty() and os.environ.get("TERM") != "dumb"
    except (AttributeError, ValueError):
        return False


def job_console(emit: Callable[[str], None], live: bool | None = None) -> JobConsole:
    """The live view when stdout is a terminal (or `live`), else plain lines through `emit`."""
    if live if live is not None else stdout_is_terminal():
        return LiveConsole()
    return PlainConsole(emit)
