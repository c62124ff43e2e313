"""Cluster mode's side in the job: a client of the Brain's HTTP service that never holds the job up.

While the Brain (or its database) is away, statistics wait in a bounded buffer (nothing is lost
within `buffer_limit` samples; past it the oldest go, and `dropped` counts them) and are sent, in
order, once it answers again; the job runs in single-job mode meanwhile (`mode`). Attempts back
off (`retry_min_s` doubling to `retry_max_s`) so a Brain that is down costs one refused connection
per backoff, not one per report.

httpx is imported by the client itself, not by this module: `dlu_prime.brain_port.models` (which
the PrimeMaster's modules import) runs this package's `__init__`, and httpx with the rich and
click it imports cost `dlu run` and the embedded Ray's worker zygote 0.1 s each on every start.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from dlu_prime.brain_port.models import (
    JobEnd,
    JobPlan,
    JobRegistration,
    PlanOutcome,
    StatSample,
    StatsBatch,
)
from dlu_prime.brain_port.port import BrainMode, BrainPort

if TYPE_CHECKING:
    import httpx

logger = logging.getLogger(__name__)

BRAIN_URL_ENV = "DLU_BRAIN_URL"
CHUNK = 500  # samples per request
# Registration fields newer Brains take, with what an older Brain uses instead (for the warning)
NEWER_FIELDS = {
    "marginal_threshold": "threshold",
    "backlog_target_s": "backlog target",
}


class BrainAway(Exception):
    """The Brain did not answer, or answered that it cannot serve now (its database is down)."""


class BrainRefused(Exception):
    """The Brain answered 4xx: what was sent is wrong and sending it again cannot help."""

    def __init__(self, path: str, message: str) -> None:
        super().__init__(message)
        self.path = path


class BrainClient(BrainPort):
    def __init__(
        self,
        url: str,
        *,
        buffer_limit: int = 100_000,
        timeout_s: float = 2.0,
        retry_min_s: float = 0.5,
        retry_max_s: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"Brain URL {url!r}: give http://HOST:PORT (what `dlu brain serve` prints)")
        import httpx

        self.url = url.rstrip("/")
        self._http_error = httpx.HTTPError
        self._http = httpx.Client(base_url=self.url, timeout=timeout_s, transport=transport)
        self._clock = clock
        self._retry_min_s = retry_min_s
        self._retry_max_s = retry_max_s
        self._backoff = retry_min_s
        self._next_attempt = 0.0
        self._up = False
        self._job: JobRegistration | None = None
        self._registered = False
        self._pending: deque[StatSample] = deque(maxlen=buffer_limit)
        self._outcomes: list[PlanOutcome] = []
        self._end: JobEnd | None = None
        self._seq = time.time_ns() // 1000  # unique across restarts of the reporter
        self.dropped = 0
        self.last_error = ""

    # -- BrainPort --------------------------------------------------------------------------
    @property
    def mode(self) -> BrainMode:
        return BrainMode.CLUSTER if self._up else BrainMode.SINGLE_JOB

    @property
    def buffered(self) -> int:
        return len(self._pending)

    def job_started(self, job: JobRegistration) -> JobPlan | None:
        self._job = job
        self._registered = False
        self._flush()
        return self._first_plan

    def report(self, samples: list[StatSample]) -> None:
        for sample in samples:
            if len(self._pending) == self._pending.maxlen:
                self.dropped += 1
            self._seq += 1
            self._pending.append(sample.model_copy(update={"seq": self._seq}))
        self._flush()

    def plan(self) -> JobPlan | None:
        if not self._flush() or self._job is None:
            return None
        try:
            return JobPlan.model_validate(
                self._call("GET", f"/v1/jobs/{self._job.name}/plan", params={"run_id": self._job.run_id})
            )
        except BrainAway as exc:
            self._away(exc)
            return None
        except BrainRefused as exc:
            logger.error("%s", exc)
            return None

    def plan_outcome(self, outcome: PlanOutcome) -> None:
        self._outcomes.append(outcome)
        self._flush()

    def job_finished(self, outcome: str) -> None:
        if self._job is not None:
            self._end = JobEnd(run_id=self._job.run_id, outcome=outcome)
        self._next_attempt = 0.0  # the last chance to deliver: try now
        self._flush()

    def close(self) -> None:
        self._http.close()

    # -- delivery ---------------------------------------------------------------------------
    _first_plan: JobPlan | None = None

    def _flush(self) -> bool:
        """Deliver what waits, in order; True when everything was delivered (the Brain is up)."""
        if self._job is None or self._clock() < self._next_attempt:
            return False
        name = self._job.name
        try:
            if not self._registered:
                self._first_plan = JobPlan.model_validate(self._register(self._job))
                self._registered = True
            while self._pending:
                chunk = [self._pending[i] for i in range(min(CHUNK, len(self._pending)))]
                batch = StatsBatch(run_id=self._job.run_id, samples=chunk)
                self._call("POST", f"/v1/jobs/{name}/samples", json=batch.model_dump(mode="json"))
                for _ in chunk:
                    self._pending.popleft()
            while self._outcomes:
                self._call(
                    "POST", f"/v1/jobs/{name}/plan-outcome", json=self._outcomes[0].model_dump(mode="json")
                )
                self._outcomes.pop(0)
            if self._end is not None:
                self._call("POST", f"/v1/jobs/{name}/end", json=self._end.model_dump(mode="json"))
                self._end = None
        except BrainAway as exc:
            self._away(exc)
            return False
        except BrainRefused as exc:
            # Resending what the Brain refused cannot help: drop it, say so, keep the rest.
            logger.error("%s; dropped", exc)
            self._drop_refused(exc.path)
            return False
        if not self._up:
            logger.info("Brain at %s answers: cluster mode", self.url)
        self._up = True
        self._backoff = self._retry_min_s
        return True

    def _register(self, job: JobRegistration) -> Any:
        """POST the registration. An older Brain refuses the fields it does not know (its wire
        models forbid extras): the job then registers without each field it named, and says so,
        rather than leave cluster mode for good. A Brain older than two fields may name one per
        answer (the answer is cut short), so this asks again until none is left to drop."""
        path = f"/v1/jobs/{job.name}/start"
        while True:
            try:
                return self._call("POST", path, json=job.model_dump(mode="json", exclude_none=True))
            except BrainRefused as exc:
                told = str(exc)
                unknown = [f for f in NEWER_FIELDS if getattr(job, f) is not None and f in told]
                if "extra" not in told or not unknown:
                    raise
            for name in unknown:
                logger.warning(
                    "the Brain at %s is older and takes no %s: it plans job %s with its own %s, "
                    "not the spec's %g", self.url, name, job.name, NEWER_FIELDS[name], getattr(job, name),
                )  # fmt: skip
            job = job.model_copy(update=dict.fromkeys(unknown))
            self._job = job

    def _drop_refused(self, path: str) -> None:
        if path.endswith("/start"):
            self._job = None  # the Brain will not have this job: single-job mode for good
        elif path.endswith("/samples"):
            for _ in range(min(CHUNK, len(self._pending))):
                self._pending.popleft()
                self.dropped += 1
        elif path.endswith("/plan-outcome"):
            self._outcomes.pop(0)
        elif path.endswith("/end"):
            self._end = None

    def _away(self, exc: BrainAway) -> None:
        if self._up or str(exc) != self.last_error:
            logger.warning(
                "Brain at %s away (%s): single-job mode, %d samples buffered",
                self.url,
                exc,
                len(self._pending),
            )
        self._up = False
        self.last_error = str(exc)
        self._next_attempt = self._clock() + self._backoff
        self._backoff = min(self._retry_max_s, self._backoff * 2)

    def _call(self, method: str, path: str, **kwargs: Any) -> Any:
        try:
            answer = self._http.request(method, path, **kwargs)
        except self._http_error as exc:
            raise BrainAway(f"{type(exc).__name__}: {exc}") from exc
        if answer.status_code == 503:
            raise BrainAway(f"503: {answer.text[:200]}")
        if answer.status_code >= 400:
            # A refusal is not an outage: say it loudly and do not resend what was refused.
            raise BrainRefused(
                path, f"Brain refused {method} {path}: {answer.status_code} {answer.text[:300]}"
            )
        return answer.json()
