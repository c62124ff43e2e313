"""The job spec's `autoscale:` switch: who sizes the job's roles while it runs.

`off` (the default): a role's size changes only when the user asks (`dlu scale`), or when an
elastic role grows onto capacity as its nnodes MIN:MAX says. A job whose size changes by itself
changes its speed, its cost and, for a job tuned to a world size, its results; that is opted
into, never a surprise. `single-job`: the PrimeMaster sizes the roles from the statistics it
holds. `cluster`: the Brain (`dlu brain serve`) plans the sizes from every job's statistics and
the PrimeMaster executes its plans, deciding itself while the Brain is away.

Part of the job spec (`dlu_api.spec.models`, which re-exports these models).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from enum import StrEnum

from pydantic import Field, field_validator

from dlu_api.spec.model_base import MAX_SECONDS, SpecModel

BRAIN_URL_ENV = "DLU_BRAIN_URL"
# A step that adds a node must bring 30% of what linear scaling would: low enough that a job whose
# speed peaks inside its nnodes MIN:MAX settles within 10% of its fastest size, high enough that
# a node bringing a tenth of its share is refused (docs/autoscaling.md has the measurements).
DEFAULT_MARGINAL_THRESHOLD = 0.3
# A backlog role gets actors enough to drain what waits in this many seconds (the Brain's own
# setting for a job that does not send it is the same).
DEFAULT_BACKLOG_TARGET_S = 30.0


class AutoscaleMode(StrEnum):
    OFF = "off"
    SINGLE_JOB = "single-job"
    CLUSTER = "cluster"


class AutoscaleSettings(SpecModel):
    """Auto-scaling of the job's elastic roles (by measured marginal throughput) and of its
    backlog roles (sized to the backlog of the channel or shard queue they drain)."""

    mode: AutoscaleMode = Field(
        default=AutoscaleMode.OFF,
        description="off (sizes change only by `dlu scale`), single-job (the PrimeMaster decides) "
        "or cluster (the Brain plans, the PrimeMaster executes).",
    )
    marginal_threshold: float = Field(
        default=DEFAULT_MARGINAL_THRESHOLD,
        allow_inf_nan=False,
        description="An elastic role grows while the added nodes keep at least this share of "
        "linear scaling (0 < t <= 1), and shrinks back from a size that did not.",
    )
    backlog_roles: dict[str, str] = Field(
        default_factory=dict[str, str],
        description="Simple roles sized to a backlog: role -> the data channel or shard queue it "
        "drains (sized within 1..max_total).",
    )
    backlog_target_s: float = Field(
        default=DEFAULT_BACKLOG_TARGET_S,
        gt=0,
        le=MAX_SECONDS,
        allow_inf_nan=False,
        description="A backlog role gets actors enough to drain its backlog in this many seconds.",
    )
    settle_s: float = Field(
        default=30.0,
        ge=0,
        le=MAX_SECONDS,
        allow_inf_nan=False,
        description="After a resize, wait this long before measuring (the new world warms up).",
    )
    measure_s: float = Field(
        default=30.0,
        gt=0,
        le=MAX_SECONDS,
        allow_inf_nan=False,
        description="Measure a size this long (after settle_s) before deciding from it.",
    )
    brain_url: str | None = Field(
        default=None,
        description="cluster mode: the Brain's http://HOST:PORT; unset: $DLU_BRAIN_URL.",
    )

    @field_validator("marginal_threshold")
    @classmethod
    def _share(cls, value: float) -> float:
        if not 0 < value <= 1:
            raise ValueError(
                f"autoscale.marginal_threshold {value:g} is outside (0, 1]: it is the share of linear "
                "scaling the added nodes must keep; give e.g. 0.3 (30% of linear, the default)"
            )
        return value

    @field_validator("brain_url")
    @classmethod
    def _url(cls, value: str | None) -> str | None:
        if value is not None and not value.startswith(("http://", "https://")):
            raise ValueError(
                f"autoscale.brain_url {value!r} is not a URL: give http://HOST:PORT (what "
                "`dlu brain serve` prints), or leave it out and set $DLU_BRAIN_URL"
            )
        return value

    @property
    def on(self) -> bool:
        return self.mode is not AutoscaleMode.OFF


class BrainUrlMissing(ValueError):
    """cluster mode with no Brain URL in the spec nor in the environment."""


def brain_url(settings: AutoscaleSettings, environ: Mapping[str, str] | None = None) -> str | None:
    """The Brain a cluster-mode job reports to: the spec's URL, else $DLU_BRAIN_URL; None for
    the other modes.

    Raises:
        BrainUrlMissing: cluster mode and no URL anywhere (the message says where to put one).
    """
    if settings.mode is not AutoscaleMode.CLUSTER:
        return None
    env = os.environ if environ is None else environ
    url = settings.brain_url or env.get(BRAIN_URL_ENV, "").strip()
    if not url:
        raise BrainUrlMissing(
            "autoscale.mode is cluster but no Brain URL is given: set autoscale.brain_url: "
            f"http://HOST:8470 in the spec or export {BRAIN_URL_ENV}=http://HOST:8470 (start one "
            "with `dlu brain serve`), or use mode: single-job"
        )
    if not url.startswith(("http://", "https://")):
        raise BrainUrlMissing(f"{BRAIN_URL_ENV}={url!r} is not a URL: give http://HOST:PORT")
    return url
