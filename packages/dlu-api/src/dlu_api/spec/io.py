"""Reading and writing job specs as YAML or JSON; pydantic errors become `SpecError`s."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from dlu_api.errors import Problem, SpecError
from dlu_api.spec.models import JobSpec
from dlu_api.spec.rules import ensure_valid


def _child(node: Any, part: int | str) -> Any:
    if isinstance(part, int):
        items: list[Any] = node if isinstance(node, list) else []  # pyright: ignore[reportUnknownVariableType]
        return items[part] if part < len(items) else None
    mapping: dict[str, Any] = node if isinstance(node, dict) else {}  # pyright: ignore[reportUnknownVariableType]
    return mapping.get(part)


def _path(loc: tuple[int | str, ...], data: Any) -> str:
    """'roles[trainer].total' from pydantic's ('roles', 0, 'total'), using role names when known."""
    out = ""
    node: Any = data
    for part in loc:
        node = _child(node, part)
        if isinstance(part, int):
            name: Any = _child(node, "name")
            out += f"[{name if isinstance(name, str) else part}]"
        else:
            out += f".{part}" if out else part
    return out or "spec"


def _fix(kind: str, ctx: dict[str, Any], field: str) -> str:
    leaf = field.rsplit(".", 1)[-1]
    if kind == "missing":
        return f"add {leaf}."
    if kind == "extra_forbidden":
        return "remove it; `dlu schema` lists the fields a spec may have."
    if kind in ("greater_than_equal", "greater_than"):
        bound = ctx.get("ge", ctx.get("gt"))
        return f"use a value {'>=' if kind == 'greater_than_equal' else '>'} {bound}."
    if kind == "string_pattern_mismatch":
        return f"match the pattern {ctx.get('pattern')} (e.g. lowercase letters, digits and '-')."
    if kind in ("enum", "literal_error"):
        return f"use one of {ctx.get('expected')}."
    if kind == "too_short":
        return f"give at least {ctx.get('min_length')} item(s)."
    return "see `dlu schema` for the expected type."


def problems_from_validation(error: ValidationError, data: Any) -> list[Problem]:
    problems: list[Problem] = []
    for item in error.errors(include_url=False):
        field = _path(tuple(item["loc"]), data)
        message = item["msg"].removeprefix("Value error, ")
        problems.append(Problem(field, message + ".", _fix(item["type"], dict(item.get("ctx") or {}), field)))
    return problems


def spec_from_dict(data: Any, *, validate: bool = True) -> JobSpec:
    """Build a JobSpec from plain data (as loaded from YAML or JSON).

    Raises:
        SpecError: the data is not a valid spec; lists every problem found.
    """
    if not isinstance(data, dict):
        raise SpecError(
            [Problem("spec", "a job spec must be a mapping.", "start the file with 'name: ...'.")]
        )
    try:
        spec = JobSpec.model_validate(data)
    except ValidationError as exc:
        raise SpecError(problems_from_validation(exc, data)) from None
    return ensure_valid(spec) if validate else spec


def load_spec_text(text: str, *, fmt: str = "yaml", validate: bool = True) -> JobSpec:
    """Parse a spec from YAML (a superset of JSON) or strict JSON text.

    Raises:
        SpecError: unparsable text or an invalid spec.
    """
    try:
        data = json.loads(text) if fmt == "json" else yaml.safe_load(text)
    except (json.JSONDecodeError, yaml.YAMLError) as exc:
        raise SpecError([Problem("spec", f"cannot parse {fmt.upper()}: {exc}", "fix the syntax.")]) from None
    return spec_from_dict(data, validate=validate)


def load_spec(path: str | Path, *, validate: bool = True) -> JobSpec:
    """Load a spec file; `.json` is read as JSON, anything else as YAML.

    Raises:
        SpecError: the file is missing, unparsable or invalid.
    """
    file = Path(path)
    try:
        text = file.read_text(encoding="utf-8")
    except OSError as exc:
        raise SpecError(
            [Problem("spec", f"cannot read {file}: {exc.strerror}.", "check the path.")]
        ) from None
    fmt = "json" if file.suffix.lower() == ".json" else "yaml"
    return load_spec_text(text, fmt=fmt, validate=validate)


def spec_to_dict(spec: JobSpec) -> dict[str, Any]:
    return spec.model_dump(mode="json")


def dump_spec(spec: JobSpec, fmt: str = "yaml") -> str:
    """The spec as YAML or JSON text; loading it back gives an equal spec."""
    data = spec_to_dict(spec)
    if fmt == "json":
        return json.dumps(data, indent=2) + "\n"
    return yaml.safe_dump(data, sort_keys=False, default_flow_style=False, allow_unicode=True)


def job_schema() -> dict[str, Any]:
    """The JSON Schema of a job spec."""
    return JobSpec.model_json_schema()
