"""What every model of the job spec shares: the strict base model, the bounds of its numbers and
the memory field type.

Pydantic's lax mode reads `true` as 1, '1_0' as 10 and '٣' (an Arabic-Indic 3) as 3, and a float
field takes .inf and .nan: none of that is what a spec's author meant, so every number field
refuses booleans, text that is not plain ASCII digits, and non-finite values. Counts and
durations are bounded, so that a typo (`total: 1000000`, `node_num: 2**63`) is refused here,
naming the field, before anything plans a million actors.
"""

from __future__ import annotations

import types
import typing
from typing import Annotated, Any

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationInfo, field_validator
from pydantic_core import PydanticCustomError

from dlu_api.spec.torchrun import MAX_NODES  # node_num, and elastic nnodes
from dlu_api.spec.units import parse_memory

__all__ = [
    "MAX_ACTORS",
    "MAX_AMOUNT",
    "MAX_COUNT",
    "MAX_NODES",
    "MAX_PER_NODE",
    "MAX_SECONDS",
    "MemoryBytes",
    "SpecModel",
]

# Bounds of the spec's numbers: far above any real job, low enough to plan in a second.
MAX_ACTORS = 10_000  # a role's total (and every role's together)
MAX_PER_NODE = 1_024  # device_per_node, per_group, nproc_per_node
MAX_COUNT = 1_000_000  # restart budgets and other counts
MAX_SECONDS = 365 * 24 * 3600.0  # every duration: one year
MAX_AMOUNT = 1_000_000.0  # cpu, gpu and custom resources of one actor


def _number_kind(annotation: Any) -> str | None:
    """'whole number' for int fields, 'number' for float ones (optional or not), else None."""
    if annotation is int:
        return "whole number"
    if annotation is float:
        return "number"
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        kinds = {_number_kind(arg) for arg in typing.get_args(annotation)} - {None}
        return kinds.pop() if len(kinds) == 1 else None
    return None


class SpecModel(BaseModel):
    """Every spec model: unknown fields are errors, assignments are validated, numbers are
    numbers (see the module's docstring)."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)

    @field_validator("*", mode="before")
    @classmethod
    def _plain_numbers(cls, value: Any, info: ValidationInfo) -> Any:
        field = cls.model_fields.get(info.field_name or "")
        kind = _number_kind(field.annotation) if field is not None else None
        if kind is None:
            return value
        if isinstance(value, bool):
            raise PydanticCustomError(
                "bool_not_number",
                "{shown} is a boolean, not a {kind}",
                {"shown": str(value).lower(), "kind": kind},
            )
        if isinstance(value, str) and ("_" in value or not value.isascii()):
            # other text is pydantic's to refuse (or, for memory, a size such as '4GiB')
            raise PydanticCustomError(
                "plain_digits",
                "{shown} is not a {kind} written in the digits 0-9",
                {"shown": ascii(value), "kind": kind},
            )
        return value


def _bounded_memory(value: object) -> int:
    size = parse_memory(value)
    if size > 2**60:
        raise ValueError(f"memory {value!r} is more than 1 EiB")
    return size


MemoryBytes = Annotated[
    int,
    BeforeValidator(_bounded_memory),
    Field(description="Bytes; strings like '4GiB' or '512MB' are accepted and stored as bytes."),
]
