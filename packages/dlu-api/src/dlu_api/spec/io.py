"""Reading and writing job specs as YAML or JSON; pydantic errors become `SpecError`s.

A spec file must be UTF-8 and may not write a key twice in one mapping (YAML and JSON loaders
would keep the last silently): both are refused naming the file, the key and its lines. Every
reader's limit (`dlu_api.spec.plain`) is checked before the data is built, and every problem of
a spec is reported at once: a duplicate key or a YAML date does not hide the others.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from dlu_api.errors import Problem, SpecError
from dlu_api.spec.fixes import field_path, problems_from_validation
from dlu_api.spec.models import JobSpec
from dlu_api.spec.plain import MAX_SPEC_BYTES, check_plain, check_size, escape_text
from dlu_api.spec.rules import check_spec
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
    return _build(data, [], validate=validate)


def _build(data: Any, found: list[Problem], *, validate: bool) -> JobSpec:
    """The spec, or a `SpecError` with `found` and every problem of the data."""
    if not isinstance(data, dict):
        raise SpecError(
            [*found, Problem("spec", "a job spec must be a mapping.", "start the file with 'name: ...'.")]
        )
    clean, problems = check_plain(data)
    problems = [*found, *problems]
    try:
        spec = JobSpec.model_validate(clean)
    except ValidationError as exc:
        raise SpecError([*problems, *problems_from_validation(exc, clean)]) from None
    if validate:
        problems += check_spec(spec)
    if problems:
        raise SpecError(problems)
    return spec


def spec_text_data(text: str, *, fmt: str = "yaml", source: str = "the spec") -> Any:
    """Plain data from YAML (a superset of JSON) or strict JSON text; `source` names it in errors.

    Raises:
        SpecError: unparsable text, or a key written twice in one mapping.
    """
    kind = fmt.upper()
    check_size(len(text), source)
    try:
        data, duplicates = load_json(text, source) if fmt == "json" else load_yaml(text, source)
    except (json.JSONDecodeError, yaml.YAMLError) as exc:
        raise SpecError(
            [Problem("spec", f"cannot parse {kind} in {source}: {exc}", f"fix the {kind} syntax there.")]
        ) from None
    except RecursionError:  # a parser's own recursion, past what the event pass lets through
        raise SpecError([Problem("spec", f"{source} nests too deep to read.", "flatten the data.")]) from None
    if duplicates:
        _build(data, [_duplicate_problem(d, data, source, kind) for d in duplicates], validate=True)
    return data


def _duplicate_problem(duplicate: DuplicateKey, data: Any, source: str, kind: str) -> Problem:
    where = field_path(duplicate.loc, data) if duplicate.loc else "the top level"
    lines = ", ".join(map(str, duplicate.lines))
    where, key = escape_text(where), escape_text(duplicate.key)
    return Problem(
        escape_text(field_path((*duplicate.loc, duplicate.key), data)),
        f"{source} sets {key!r} {len(duplicate.lines)} times in {where} (lines {lines}); "
        f"{kind} keeps only the last, so the others would be ignored without a word.",
        f"keep one {key!r} in {where}: delete or rename the one(s) on line(s) "
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
        with file.open("rb") as stream:
            check_size(os.fstat(stream.fileno()).st_size, str(file))
            raw = stream.read(MAX_SPEC_BYTES + 1)  # a pipe or a growing file: read no more
        check_size(len(raw), str(file))
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
