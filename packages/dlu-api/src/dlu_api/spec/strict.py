"""Spec text to plain data, with what YAML and JSON loaders let through silently made visible.

Both formats keep only the last of two equal keys in a mapping, so a spec with `name:` twice
would run under the second name without a word. Here every duplicate key is found, at any
depth, with its lines, before the data is built.
"""

from __future__ import annotations

import bisect
import json
from collections import defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, cast

import yaml
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

Loc = tuple[int | str, ...]

_MERGE_TAG = "tag:yaml.org,2002:merge"

# json's own string scanner (the typing stubs leave it out): (decoded string, index after it).
_scanstring = cast("Callable[[str, int], tuple[str, int]]", vars(json.decoder)["scanstring"])


@dataclass(frozen=True)
class DuplicateKey:
    """A key written more than once in one mapping: where the mapping is, and every line."""

    loc: Loc  # the mapping holding the key (pydantic-style: keys and list indexes)
    key: str
    lines: tuple[int, ...]  # 1-based, in document order


def _duplicates(keys: Iterator[tuple[Loc, Any, str, int]]) -> list[DuplicateKey]:
    """`keys`: (mapping loc, identity of the key, key as written, line) of every key."""
    seen: dict[tuple[Loc, Any], list[int]] = defaultdict(list)
    written: dict[tuple[Loc, Any], str] = {}
    for loc, identity, text, line in keys:
        seen[loc, identity].append(line)
        written.setdefault((loc, identity), text)
    return [
        DuplicateKey(where[0], written[where], tuple(lines))
        for where, lines in seen.items()
        if len(lines) > 1
    ]


def load_yaml(text: str) -> tuple[Any, list[DuplicateKey]]:
    """The document's data (last value wins, as `yaml.safe_load`) and its duplicate keys.

    Raises:
        yaml.YAMLError: the text is not one YAML document.
    """
    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
        duplicates = _duplicates(_yaml_keys(node, (), set())) if node is not None else []
        data = cast("Any", loader.construct_document(node)) if node is not None else None  # pyright: ignore[reportUnknownMemberType]
    finally:
        loader.dispose()  # pyright: ignore[reportUnknownMemberType]
    return data, duplicates


def _yaml_keys(node: Node, loc: Loc, walked: set[int]) -> Iterator[tuple[Loc, Any, str, int]]:
    # An alias is the same node object again: walking each node once keeps anchors cheap.
    if id(node) in walked:
        return
    walked.add(id(node))
    if isinstance(node, MappingNode):
        pairs: list[tuple[Node, Node]] = node.value
        for key, value in pairs:
            if not isinstance(key, ScalarNode) or key.tag == _MERGE_TAG:
                # '<<' merges may legitimately repeat keys written next to them
                continue
            text = str(key.value)
            yield loc, (key.tag, text), text, key.start_mark.line + 1
            yield from _yaml_keys(value, (*loc, text), walked)
    elif isinstance(node, SequenceNode):
        items: list[Node] = node.value
        for index, item in enumerate(items):
            yield from _yaml_keys(item, (*loc, index), walked)


def load_json(text: str) -> tuple[Any, list[DuplicateKey]]:
    """The document's data (last value wins, as `json.loads`) and its duplicate keys.

    Raises:
        json.JSONDecodeError: the text is not JSON.
    """
    data = json.loads(text)
    return data, _duplicates(_json_keys(text))


@dataclass
class _Frame:
    loc: Loc
    is_object: bool
    key: str = ""
    index: int = 0
    expect_key: bool = True


def _json_keys(text: str) -> Iterator[tuple[Loc, Any, str, int]]:
    """Every object key of `text`, which `json.loads` accepted, with its line."""
    starts = [0] + [i + 1 for i, char in enumerate(text) if char == "\n"]
    stack: list[_Frame] = []

    def child() -> Loc:
        if not stack:
            return ()
        top = stack[-1]
        return (*top.loc, top.key if top.is_object else top.index)

    i = 0
    while i < len(text):
        char = text[i]
        if char == '"':
            value, end = _scanstring(text, i + 1)
            if stack and stack[-1].is_object and stack[-1].expect_key:
                top = stack[-1]
                yield top.loc, value, value, bisect.bisect_right(starts, i)
                top.key, top.expect_key = value, False
            i = end
            continue
        if char in "{[":
            stack.append(_Frame(child(), is_object=char == "{"))
        elif char in "}]":
            stack.pop()
        elif char == "," and stack:
            if stack[-1].is_object:
                stack[-1].expect_key = True
            else:
                stack[-1].index += 1
        i += 1
