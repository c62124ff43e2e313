"""`logs.tee` for `dlu run`: the tee'd streams of every rank printed with a `[role/rankN]` prefix.

Read from the rank log files (locally) or Ray's log API (on a cluster), never from Ray's own
forwarding of worker output, which `dlu run` may turn off. Starts once a status names the run.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

from dlu_api.client.base import JobClient
from dlu_api.errors import DLUError
from dlu_api.rank_logs import MARKER_PREFIX as START_MARKER
from dlu_api.rank_logs import STREAMS, RankFile, RankStreams, parse_modes
from dlu_api.status import JobStatus

if TYPE_CHECKING:
    from dlu_api.spec.models import JobSpec

logger = logging.getLogger(__name__)


def tee_filter(spec: JobSpec) -> Callable[[RankFile], bool] | None:
    """Which rank files `dlu run` mirrors; None when the spec tees nothing."""
    if parse_modes(spec.logs.tee, "logs.tee") == 0:
        return None
    bits = {suffix: bit for bit, suffix in STREAMS.items()}

    def wanted(file: RankFile) -> bool:
        return bool(RankStreams.of(spec.logs.redirects, spec.logs.tee, file.rank).tee & bits[file.stream])

    return wanted


class RankTee:
    """Follows the tee'd rank files of one run in a thread; `stop()` prints what is left."""

    def __init__(self, client: JobClient, spec: JobSpec, echo: Callable[[str], None]) -> None:
        self._client = client
        self._wanted = tee_filter(spec)
        self._echo = echo
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._markers: set[str] = set()
        self.traceback_shown = False
        """Whether a traceback was printed (a failing rank's stderr): the final status then
        does not print it again."""

    def see(self, status: JobStatus) -> None:
        """Called with every status: the first that names the run starts the follower."""
        if self._wanted is None or self._thread is not None or not status.run_id:
            return
        self._thread = threading.Thread(target=self._run, args=(status,), name="dlu-tee", daemon=True)
        self._thread.start()

    def _run(self, status: JobStatus) -> None:
        assert self._wanted is not None
        try:
            for line in self._client.tee_lines(status, self._wanted, self._stop):
                if self._show(line):
                    self._echo(line)
        except DLUError as exc:
            logger.warning("--tee: cannot follow the rank logs: %s", exc)

    def _show(self, line: str) -> bool:
        """Each rank's start marker once (it heads both its stdout and stderr files)."""
        _, _, text = line.partition("] ")
        if text.startswith(START_MARKER):
            if text in self._markers:
                return False
            self._markers.add(text)
        elif text.startswith("Traceback (most recent call last)"):
            self.traceback_shown = True
        return True

    def stop(self, timeout_s: float = 5.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)
