"""Pydantic's errors on a spec, as problems that name the field and say what to write there.

A fix names the field and the value it takes ("set total to a whole number, e.g. total: 1"),
the fields a block accepts, the closest spelling of a mistyped one; never "see the schema".
"""

from __future__ import annotations

import difflib
import types
import typing
from typing import Any

from pydantic import BaseModel, ValidationError
from pydantic.fields import FieldInfo

from dlu_api.errors import Problem
from dlu_api.spec.models import JobSpec

Loc = tuple[int | str, ...]

# What a field takes, where its type alone does not say it.
_HINTS: dict[str, str] = {
    "memory": "bytes or a size with a unit, e.g. memory: 4GiB (B, KB, MB, GB, TB, KiB, MiB, GiB, TiB)",
    "custom": "resource names other than CPU, GPU, memory and object_store_memory (those are the "
    "cpu, gpu and memory fields), each with an amount >= 0, e.g. custom: {my_accel: 1}",
    "nnodes": "a node count 'N' or a range 'MIN:MAX' with 1 <= MIN <= MAX, e.g. nnodes: '2:4'",
    "entrypoint": "'package.module:function', 'script.py args...', '-m package.module args...' "
    "or a torchrun command, e.g. entrypoint: 'train.py --lr 0.1'",
    "sub_master": "'package.module:MySubMaster'",
    "extension": "an entry point name of the 'dlu.extensions' group, or 'package.module:Class'",
}


def _child(node: Any, part: int | str) -> Any:
    if isinstance(part, int):
        items: list[Any] = node if isinstance(node, list) else []  # pyright: ignore[reportUnknownVariableType]
        return items[part] if part < len(items) else None
    mapping: dict[str, Any] = node if isinstance(node, dict) else {}  # pyright: ignore[reportUnknownVariableType]
    return mapping.get(part)


def field_path(loc: Loc, data: Any) -> str:
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


def _model_in(annotation: Any) -> type[BaseModel] | None:
    """The model inside a field's type: `Resources`, `list[RoleSpec]`, `ElasticSettings | None`."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    if typing.get_origin(annotation) in (list, typing.Union, types.UnionType):
        for arg in typing.get_args(annotation):
            found = _model_in(arg)
            if found is not None:
                return found
    return None


def _locate(loc: Loc) -> tuple[type[BaseModel] | None, FieldInfo | None]:
    """The model that holds the field at `loc`, and the field (None where `loc` leaves the models,
    e.g. inside `config` or `env`)."""
    model: type[BaseModel] | None = JobSpec
    info: FieldInfo | None = None
    for index, part in enumerate(loc):
        if isinstance(part, int):
            continue
        if model is None:
            return None, None
        info = model.model_fields.get(part)
        if index == len(loc) - 1:
            return model, info
        model = _model_in(info.annotation) if info is not None else None
    return model, None


def _example(leaf: str, info: FieldInfo | None, fallback: str) -> str:
    default = info.default if info is not None else None
    if isinstance(default, int | float) and not isinstance(default, bool):
        return f"{leaf}: {default}"
    return f"{leaf}: {fallback}"


def _about(info: FieldInfo | None) -> str:
    """' (what the field is)' from its description, for a fix."""
    text = (info.description or "").rstrip(".") if info is not None else ""
    return f" ({text[:1].lower()}{text[1:]})" if text else ""


def _fields_of(model: type[BaseModel] | None) -> list[str]:
    return list(model.model_fields) if model is not None else []


def fix_for(kind: str, ctx: dict[str, Any], loc: Loc, field: str) -> str:
    """What to change at `field` for a pydantic error of type `kind`."""
    leaf = str(loc[-1]) if loc and isinstance(loc[-1], str) else field
    parent = field.rsplit(".", 1)[0] if "." in field else "the top level of the spec"
    model, info = _locate(loc)
    hint = _HINTS.get(leaf)
    about = _about(info)
    if kind == "missing":
        return f"add '{leaf}:' to {parent}{about}."
    if kind == "extra_forbidden":
        allowed = _fields_of(model)
        close = difflib.get_close_matches(leaf, allowed, n=1)
        rename = f", or rename it to {close[0]!r}" if close else ""
        return f"remove {leaf!r}{rename}; {parent} takes: {', '.join(allowed)}."
    if kind in ("less_than_equal", "less_than"):
        bound = ctx.get("le", ctx.get("lt"))
        return (
            f"set {leaf} to a value {'<=' if kind == 'less_than_equal' else '<'} {bound}; "
            "a larger one is a typo or more than one job can run."
        )
    if kind == "finite_number":
        return f"set {leaf} to a finite number, e.g. {_example(leaf, info, '1.0')} (not .inf or .nan)."
    if kind == "bool_not_number":
        return f"set {leaf} to a number, e.g. {_example(leaf, info, '1')}."
    if kind in ("greater_than_equal", "greater_than"):
        bound = ctx.get("ge", ctx.get("gt"))
        return f"set {leaf} to a value {'>=' if kind == 'greater_than_equal' else '>'} {bound}."
    if kind == "string_pattern_mismatch":
        return f"make {leaf} match the pattern {ctx.get('pattern')} (e.g. lowercase letters, digits and '-')."
    if kind in ("enum", "literal_error"):
        return f"set {leaf} to one of {ctx.get('expected')}."
    if kind == "too_short":
        return f"give {leaf} at least {ctx.get('min_length')} item(s)."
    if hint is not None:
        return f"set {leaf} to {hint}."
    if kind == "plain_digits":
        return f"write {leaf} in the digits 0-9 without '_', e.g. {_example(leaf, info, '1')}."
    if kind in ("int_type", "int_parsing", "int_from_float"):
        return f"set {leaf} to a whole number, e.g. {_example(leaf, info, '1')}."
    if kind in ("float_type", "float_parsing"):
        return f"set {leaf} to a number, e.g. {_example(leaf, info, '1.0')}."
    if kind in ("bool_type", "bool_parsing"):
        return f"set {leaf} to true or false."
    if kind == "string_type":
        return f"make {leaf} text: quote the value, e.g. {leaf}: '8'."
    if kind == "string_too_short":
        return f"give {leaf} a non-empty value."
    if kind == "list_type":
        return f"make {leaf} a list: one '- item' line per entry, or [a, b]."
    if kind in ("dict_type", "model_type", "model_attributes_type"):
        inner = _model_in(info.annotation) if info is not None else None
        takes = f"; it takes: {', '.join(_fields_of(inner))}" if inner is not None else ""
        return f"make {leaf} a mapping of 'key: value' lines indented under it{takes}."
    return f"change {field} as the message says{about}."


def problems_from_validation(error: ValidationError, data: Any) -> list[Problem]:
    problems: list[Problem] = []
    for item in error.errors(include_url=False):
        loc: Loc = tuple(item["loc"])
        field = field_path(loc, data)
        message = item["msg"].removeprefix("Value error, ")
        fix = fix_for(item["type"], dict(item.get("ctx") or {}), loc, field)
        problems.append(Problem(field, message + ".", fix))
    return problems
