"""Reading and writing job specs as YAML or JSON; pydantic errors become `SpecError`s.

A spec file must be UTF-8 and may not write a key twice in one mapping (YAML and JSON loaders
would keep the last silently): both are refused naming the file, the key and its lines.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from dlu_api.errors import Problem, SpecError
from dlu_api.spec.fixes import field_path, problems_from_validation
from dlu_api.spec.models import JobSpec
from dlu_api.spec.rules import ensure_valid
from dlu_api.spec.strict import DuplicateKey, load_json, load_yaml

__all__ = [
    "dump_spec",
    "job_schema",
    "load_spec",
    "load_spec_text",
    "problems_from_validation",
    "read_spec_data",
    "spec_from_dict",
    "spec_text_data",
    "spec_to_dict",
]


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


def spec_text_data(text: str, *, fmt: str = "yaml", source: str = "the spec") -> Any:
    """Plain data from YAML (a superset of JSON) or strict JSON text; `source` names it in errors.

    Raises:
        SpecError: unparsable text, or a key written twice in one mapping.
    """
    kind = fmt.upper()
    try:
        data, duplicates = load_json(text) if fmt == "json" else load_yaml(text)
    except (json.JSONDecodeError, yaml.YAMLError) as exc:
        raise SpecError(
            [Problem("spec", f"cannot parse {kind} in {source}: {exc}", f"fix the {kind} syntax there.")]
        ) from None
    if duplicates:
        raise SpecError([_duplicate_problem(d, data, source, kind) for d in duplicates])
    return data


def _duplicate_problem(duplicate: DuplicateKey, data: Any, source: str, kind: str) -> Problem:
    where = field_path(duplicate.loc, data) if duplicate.loc else "the top level"
    lines = ", ".join(map(str, duplicate.lines))
    return Problem(
        field_path((*duplicate.loc, duplicate.key), data),
        f"{source} sets {duplicate.key!r} {len(duplicate.lines)} times in {where} (lines {lines}); "
        f"{kind} keeps only the last, so the others would be ignored without a word.",
        f"keep one {duplicate.key!r} in {where}: delete or rename the one(s) on line(s) "
        f"{', '.join(map(str, duplicate.lines[1:]))}.",
    )


def load_spec_text(
    text: str, *, fmt: str = "yaml", validate: bool = True, source: str = "the spec"
) -> JobSpec:
    """Parse a spec from YAML (a superset of JSON) or strict JSON text.

    Raises:
        SpecError: unparsable text, a duplicate key, or an invalid spec.
    """
    return spec_from_dict(spec_text_data(text, fmt=fmt, source=source), validate=validate)


def read_spec_data(path: str | Path) -> Any:
    """The plain data of a spec file; `.json` is read as JSON, anything else as YAML.

    Raises:
        SpecError: the file is missing, not UTF-8, unparsable, or writes a key twice.
    """
    file = Path(path)
    try:
        raw = file.read_bytes()
    except OSError as exc:
        raise SpecError(
            [Problem("spec", f"cannot read {file}: {exc.strerror}.", "check the path.")]
        ) from None
    try:
        text = raw.decode("utf-8-sig")  # a byte order mark is allowed, and dropped
    except UnicodeDecodeError as exc:
        before = raw[: exc.start]
        line = before.count(b"\n") + 1
        column = exc.start - (before.rfind(b"\n") + 1) + 1
        raise SpecError(
            [
                Problem(
                    "spec",
                    f"{file} is not UTF-8 text: byte 0x{raw[exc.start]:02x} at line {line}, column "
                    f"{column} is not valid UTF-8. A spec file must be UTF-8.",
                    f"save {file} as UTF-8 (an editor's 'save with encoding', or e.g. "
                    f"`iconv -f LATIN1 -t UTF-8 {file}` for a Latin-1 file).",
                )
            ]
        ) from None
    fmt = "json" if file.suffix.lower() == ".json" else "yaml"
    return spec_text_data(text, fmt=fmt, source=str(file))


def load_spec(path: str | Path, *, validate: bool = True) -> JobSpec:
    """Load a spec file; `.json` is read as JSON, anything else as YAML.

    Raises:
        SpecError: the file is missing, not UTF-8, unparsable, writes a key twice, or is invalid.
    """
    return spec_from_dict(read_spec_data(path), validate=validate)


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
