"""How a job reaches the Brain (cluster mode) or runs without one (single-job mode)."""

from __future__ import annotations

import os

from dlu_prime.brain_port.client import BRAIN_URL_ENV, BrainAway, BrainClient
from dlu_prime.brain_port.models import (
    JobEnd,
    JobPlan,
    JobRegistration,
    PlanOutcome,
    RolePlan,
    RoleShape,
    StatSample,
    StatsBatch,
    registration_from_spec,
)
from dlu_prime.brain_port.port import BrainMode, BrainPort, NullBrain

__all__ = [
    "BRAIN_URL_ENV",
    "BrainAway",
    "BrainClient",
    "BrainMode",
    "BrainPort",
    "JobEnd",
    "JobPlan",
    "JobRegistration",
    "NullBrain",
    "PlanOutcome",
    "RolePlan",
    "RoleShape",
    "StatSample",
    "StatsBatch",
    "brain_from_env",
    "registration_from_spec",
]


def brain_from_env(url: str | None = None) -> BrainPort:
    """A client of the Brain at `url` (else $DLU_BRAIN_URL); NullBrain when neither is set."""
    url = url or os.environ.get(BRAIN_URL_ENV) or None
    return BrainClient(url) if url else NullBrain()
