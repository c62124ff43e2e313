"""What every model of the job spec shares: the strict base model and the memory field type."""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field

from dlu_api.spec.units import parse_memory


class SpecModel(BaseModel):
    """Every spec model: unknown fields are errors, assignments are validated."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)


MemoryBytes = Annotated[
    int,
    BeforeValidator(parse_memory),
    Field(description="Bytes; strings like '4GiB' or '512MB' are accepted and stored as bytes."),
]
