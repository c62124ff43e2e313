"""The elastic role's settings in the job spec: torchrun's knobs and the pre-training node check.

Part of the job spec (`dlu_api.spec.models`, which re-exports these models).
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any

from pydantic import Field, field_validator, model_validator

from dlu_api.spec.model_base import MAX_COUNT, MAX_PER_NODE, MAX_SECONDS, SpecModel
from dlu_api.spec.torchrun import parse_nnodes


class CommBackend(StrEnum):
    AUTO = "auto"  # nccl on GPU, gloo on CPU
    GLOO = "gloo"
    NCCL = "nccl"


class NodeCheckSettings(SpecModel):
    """Thresholds of the pre-training node check (timed matmul + allreduce in node pairs)."""

    enabled: bool = True
    timeout_s: float = Field(
        default=300.0, gt=0, le=MAX_SECONDS, description="A check round slower than this fails."
    )
    straggler_ratio: float = Field(
        default=2.0,
        gt=1,
        le=MAX_COUNT,
        description="A node whose best time exceeds the median by this factor is a straggler.",
    )
    exclude_stragglers: bool = False
    matmul_size: int = Field(default=1024, ge=16, le=65_536, description="Side of the square matmul.")
    allreduce_mb: float = Field(default=16.0, gt=0, le=65_536, description="Size of the allreduce payload.")


class CheckpointSettings(SpecModel):
    """Flash checkpoints' durable copies (every k-th committed step written by the agents) and
    replicas on a buddy node's agent."""

    persist_every: int = Field(
        ge=1, le=MAX_COUNT, description="Write every k-th committed step to `dir` in the background (k >= 1)."
    )
    dir: str = Field(
        min_length=1,
        max_length=4096,
        description="Local folder (shared by the nodes for a multi-node job) for the durable copies; "
        "each role writes under <dir>/<role>.",
    )
    replicas: int = Field(
        default=0,
        ge=0,
        le=1,
        description="Copies of each rank's committed step kept by a buddy node's agent (ring order over "
        "the nodes), so losing one node loses no committed step: 0 or 1.",
    )

    @model_validator(mode="after")
    def _absolute(self) -> CheckpointSettings:
        if not self.dir.startswith("/"):
            raise ValueError(
                f"checkpoint.dir must be an absolute path (got {self.dir!r}): the agents run in "
                "other working folders"
            )
        return self


class ElasticSettings(SpecModel):
    """torchrun's knobs for an elastic role."""

    nnodes: str = Field(default="1", description="Node count 'N', or an elastic range 'MIN:MAX'.")
    nproc_per_node: int = Field(default=1, ge=1, le=MAX_PER_NODE)
    comm_backend: CommBackend = CommBackend.AUTO
    node_check: NodeCheckSettings = Field(default_factory=NodeCheckSettings)
    setup_process_group: bool = Field(
        default=True, description="Call init_process_group before user code runs (functions only)."
    )
    agent_store: bool = Field(
        default=True,
        description="Host the process group's TCPStore before training starts, as torchrun's agent "
        "does (TORCHELASTIC_USE_AGENT_STORE=True), so no rank waits for rank 0's; false: rank 0's "
        "process hosts it.",
    )
    rendezvous_grace_s: float = Field(
        default=30.0,
        ge=0,
        le=MAX_SECONDS,
        description="With a MIN:MAX range, how long to wait for MAX nodes once MIN have joined.",
    )
    start_timeout_s: float = Field(
        default=60.0,
        gt=0,
        le=MAX_SECONDS,
        description="With a MIN:MAX range, how long the job waits for Ray to place MAX nodes before it "
        "starts with the nodes it has (at least MIN; fewer: it stops, saying what was missing).",
    )
    replace_timeout_s: float = Field(
        default=30.0,
        gt=0,
        le=MAX_SECONDS,
        description="With a MIN:MAX range, how long a node's ranks may stay unplaceable (Ray restarting "
        "them) before the node counts as lost for good and the role shrinks in place.",
    )
    checkpoint: CheckpointSettings | None = Field(
        default=None,
        description="Persist flash checkpoints (dlu_elastic.checkpoint) every k-th step to a folder; "
        "absent: they live in memory only.",
    )
    resize_interval_s: float = Field(
        default=60.0,
        ge=0,
        le=MAX_SECONDS,
        description="With a MIN:MAX range, the least time between two automatic resizes of the role "
        "(a flapping node cannot make it thrash).",
    )

    @field_validator("nnodes", mode="before")
    @classmethod
    def _nnodes_text(cls, value: Any) -> Any:
        if isinstance(value, int) and not isinstance(value, bool):
            return str(value)
        return value

    @field_validator("nnodes")
    @classmethod
    def _nnodes_range(cls, value: str) -> str:
        parse_nnodes(value)
        return value

    @property
    def min_nodes(self) -> int:
        return parse_nnodes(self.nnodes)[0]

    @property
    def max_nodes(self) -> int:
        return parse_nnodes(self.nnodes)[1]
