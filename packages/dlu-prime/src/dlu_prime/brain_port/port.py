"""The interface the PrimeMaster uses to reach a Brain, and the one it uses when there is none.

The PrimeMaster reports statistics and asks for plans through `BrainPort` and never knows
whether a Brain exists: `NullBrain` is single-job mode (the job's own core decides from what it
holds), `BrainClient` is cluster mode, and falls back to single-job mode while the Brain is away.
"""

from __future__ import annotations

import abc
from enum import StrEnum

from dlu_prime.brain_port.models import JobPlan, JobRegistration, PlanOutcome, StatSample


class BrainMode(StrEnum):
    SINGLE_JOB = "single-job"
    CLUSTER = "cluster"


class BrainPort(abc.ABC):
    """Every method returns quickly and never raises for a Brain that is away."""

    @abc.abstractmethod
    def job_started(self, job: JobRegistration) -> JobPlan | None:
        """Register the job; returns its first plan (from finished jobs with its signature) if any."""

    @abc.abstractmethod
    def report(self, samples: list[StatSample]) -> None:
        """Hand over statistics samples (kept and sent later while the Brain is away)."""

    @abc.abstractmethod
    def plan(self) -> JobPlan | None:
        """The job's current plan, or None in single-job mode (no Brain, or none reachable)."""

    @abc.abstractmethod
    def plan_outcome(self, outcome: PlanOutcome) -> None:
        """Say that a plan was applied, or could not be placed (the Brain then stops asking for it)."""

    @abc.abstractmethod
    def job_finished(self, outcome: str) -> None:
        """Record the job's end (its samples are flushed first where the Brain is reachable)."""

    @property
    @abc.abstractmethod
    def mode(self) -> BrainMode:
        """CLUSTER while a Brain answers, SINGLE_JOB otherwise."""

    def close(self) -> None:  # noqa: B027 - optional: most ports hold nothing to release
        """Release connections; the default holds none."""


class NullBrain(BrainPort):
    """Single-job mode: no Brain; statistics stay with the job's own accumulators."""

    def job_started(self, job: JobRegistration) -> JobPlan | None:
        return None

    def report(self, samples: list[StatSample]) -> None:
        return None

    def plan(self) -> JobPlan | None:
        return None

    def plan_outcome(self, outcome: PlanOutcome) -> None:
        return None

    def job_finished(self, outcome: str) -> None:
        return None

    @property
    def mode(self) -> BrainMode:
        return BrainMode.SINGLE_JOB
