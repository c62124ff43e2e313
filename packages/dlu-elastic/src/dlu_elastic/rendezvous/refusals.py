"""The ElasticService's refused calls, logged one line per kind per interval with a count.

A client retrying with a wrong token, or a thousand agents polling a superseded round, would
otherwise write a line per call into the user's output (2,000 calls were 2,017 lines). The first
refusal of a kind is logged at once; the next ones are counted (`dlu_prime.log_limit`) and
logged together when the interval is up, by a timer on the server's event loop, and what is
left when the server stops.
"""

from __future__ import annotations

import asyncio
import logging

from dlu_prime.log_limit import LogLimiter, Report

REFUSAL_LOG_INTERVAL_S = 10.0

NO_TOKEN = "no job token"
WRONG_TOKEN = "wrong job token"
INVALID = "invalid request"
STALE = "stale round or not a member"

# A call without the job's token is someone else's (or a misconfigured) client: a warning. A
# stale round is routine while the membership changes: information.
_LEVELS = {NO_TOKEN: logging.WARNING, WRONG_TOKEN: logging.WARNING, INVALID: logging.WARNING}

# asyncio may run a timer up to its clock's resolution early: fire a little late instead, so
# that the interval is surely up when the timer looks.
_TIMER_MARGIN_S = 0.001


class RefusalLog:
    """Lives on the server's event loop: every method is called there."""

    def __init__(self, logger: logging.Logger, loop: asyncio.AbstractEventLoop, interval_s: float) -> None:
        self._log = logger
        self._loop = loop
        self._limiter = LogLimiter(interval_s, clock=loop.time)
        self._timer: asyncio.TimerHandle | None = None

    def refused(self, kind: str, method: str, detail: str) -> None:
        report = self._limiter.record(kind, f"{method.rsplit('/', 1)[-1]}: {detail}")
        if report is not None:
            self._write(report)
        self._arm()

    def close(self) -> None:
        """Log what was counted and not yet logged; no timer is left behind."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        for report in self._limiter.drain():
            self._write(report)

    def _arm(self) -> None:
        at = self._limiter.next_due_at()
        if at is None:
            return
        at += _TIMER_MARGIN_S
        if self._timer is not None:
            if self._timer.when() <= at:
                return
            self._timer.cancel()
        self._timer = self._loop.call_at(at, self._fire)

    def _fire(self) -> None:
        self._timer = None
        for report in self._limiter.due():
            self._write(report)
        self._arm()

    def _write(self, report: Report) -> None:
        level = _LEVELS.get(report.kind, logging.INFO)
        if report.since_s is None:
            self._log.log(
                level,
                "refused a call (%s): %s; more refusals like it are counted and logged at most once "
                "every %g s",
                report.kind,
                report.latest,
                self._limiter.interval_s,
            )
        else:
            self._log.log(
                level,
                "refused %d call(s) (%s) in the last %.0f s; the latest: %s",
                report.count,
                report.kind,
                report.since_s,
                report.latest,
            )
