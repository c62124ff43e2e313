"""Limits on spec data, and the values YAML builds that a job spec cannot hold.

A spec is a few kilobytes; its reader must stay fast and small whatever it is given. Text is
refused above `MAX_SPEC_BYTES`, nesting deeper than `MAX_DEPTH`, and more than `MAX_NODES`
values once every YAML alias is expanded (a "billion laughs" file is a few lines that expand to
billions), each with a `SpecError` that names the limit, before the data is built or validated.

Values that load but are not JSON (YAML dates and timestamps, `!!binary`, `!!set`), and text
that is not valid Unicode (a lone surrogate such as "\\uD800", which cannot even be printed),
become problems naming where they are; the data is cleaned (such text escaped, such values made
strings) so that the model still reports every other problem of the spec at once.
"""

from __future__ import annotations

import datetime
import re
from typing import Any

from dlu_api.errors import Problem, SpecError

MAX_SPEC_BYTES = 1024 * 1024
MAX_DEPTH = 64
MAX_NODES = 50_000

Loc = tuple[int | str, ...]

_SURROGATE = re.compile("[\ud800-\udfff]")


def too_big(what: str, limit: str, fix: str) -> SpecError:
    """The error for input past one of the reader's limits."""
    return SpecError([Problem("spec", f"{what}; the limit is {limit}.", fix)])


def check_size(size: int, source: str) -> None:
    """Refuse text over `MAX_SPEC_BYTES` before reading or parsing it."""
    if size > MAX_SPEC_BYTES:
        raise too_big(
            f"{source} is {size:,} bytes, too large for a job spec",
            f"{MAX_SPEC_BYTES:,} bytes (1 MiB)",
            "keep large data out of the spec: put it in a file the job reads and give its path in config.",
        )


def depth_error(source: str) -> SpecError:
    return too_big(
        f"{source} nests mappings or lists more than {MAX_DEPTH} levels deep",
        f"{MAX_DEPTH} levels",
        "flatten the data (a spec needs about 5 levels); keep deep data in a file the job reads.",
    )


def nodes_error(source: str) -> SpecError:
    return too_big(
        f"{source} holds more than {MAX_NODES:,} values (keys and items, YAML aliases *name "
        "counted as the values they repeat)",
        f"{MAX_NODES:,} values",
        "keep large data out of the spec (put it in a file the job reads), and do not nest "
        "aliases in aliases: each level multiplies (a 'billion laughs' file).",
    )


def escape_text(text: str) -> str:
    """`text` with lone surrogates written as \\udXXX escapes, so that it can be printed."""
    return _SURROGATE.sub(lambda m: f"\\u{ord(m.group()):04x}", text)


def _where(loc: Loc) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else part)
    return out or "spec"


def _not_json(value: Any, loc: Loc) -> Problem:
    leaf = str(loc[-1]) if loc else "value"
    kind = type(value).__name__
    if isinstance(value, datetime.date | datetime.datetime):
        shown = value.isoformat()
        why = f"YAML reads the unquoted {shown} as a {kind}"
    else:
        shown = str(value)
        why = f"YAML reads it as a {kind} (a tag such as !!binary or !!set)"
    return Problem(
        _where(loc),
        f"{why}, but a job spec holds only JSON values (text, numbers, true/false, null, lists "
        "and mappings).",
        f"quote it so that it is text, e.g. {leaf}: '{escape_text(shown)}'.",
    )


def _surrogate(text: str, loc: Loc, is_key: bool) -> Problem:
    what = "key" if is_key else "text"
    return Problem(
        _where(loc),
        f"the {what} '{escape_text(text)}' holds a lone surrogate (a \\uD800-\\uDFFF escape without "
        "its pair), which is not valid Unicode and cannot be printed or sent.",
        "write the character itself, or a valid pair of escapes, e.g. \\uD83D\\uDE00 for one emoji.",
    )


def check_plain(data: Any, source: str = "the spec") -> tuple[Any, list[Problem]]:
    """`data` cleaned for validation, and the problems of its values.

    Walks without recursion, so any depth is safe to look at.

    Raises:
        SpecError: deeper than `MAX_DEPTH`, or more than `MAX_NODES` values.
    """
    problems: list[Problem] = []
    count = 0
    root: list[Any] = [None]
    # (value, its loc, container to write the clean value into, key or index there)
    todo: list[tuple[Any, Loc, Any, Any]] = [(data, (), root, 0)]
    while todo:
        value, loc, parent, slot = todo.pop()
        count += 1
        if count > MAX_NODES:
            raise nodes_error(source)
        if len(loc) > MAX_DEPTH:
            raise depth_error(source)
        if isinstance(value, dict):
            clean: dict[Any, Any] = {}
            parent[slot] = clean
            pairs: list[tuple[Any, Any]] = list(value.items())  # pyright: ignore[reportUnknownArgumentType]
            for key, item in pairs:
                if isinstance(key, str) and _SURROGATE.search(key):
                    problems.append(_surrogate(key, (*loc, escape_text(key)), is_key=True))
                    key = escape_text(key)
                elif not isinstance(key, str | int | float | bool) and key is not None:
                    problems.append(_not_json(key, loc))
                    key = str(key)  # pyright: ignore[reportUnknownArgumentType]
                clean[key] = None
                todo.append((item, (*loc, str(key)), clean, key))
        elif isinstance(value, list | tuple):
            items: list[Any] = [None] * len(value)  # pyright: ignore[reportUnknownArgumentType]
            parent[slot] = items
            elements: list[Any] = list(value)  # pyright: ignore[reportUnknownArgumentType]
            for index, item in enumerate(elements):
                todo.append((item, (*loc, index), items, index))
        elif isinstance(value, str):
            if _SURROGATE.search(value):
                problems.append(_surrogate(value, loc, is_key=False))
                value = escape_text(value)
            parent[slot] = value
        elif value is None or isinstance(value, bool | int | float):
            parent[slot] = value
        else:
            problems.append(_not_json(value, loc))
            parent[slot] = str(value)
    problems.sort(key=lambda p: p.field)
    return root[0], problems
