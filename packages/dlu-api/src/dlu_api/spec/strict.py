"""Spec text to plain data, with what YAML and JSON loaders let through silently made visible.

Both formats keep only the last of two equal keys in a mapping, so a spec with `name:` twice
would run under the second name without a word. Here every duplicate key is found, at any
depth, with its lines, before the data is built.

YAML is read with libyaml where it is installed (the pure-Python parser takes minutes on a large
file), as YAML 1.2 reads plain scalars with a colon: `nnodes: 1:3` is the text "1:3", not YAML
1.1's base-60 integer 63. Before any node is built, one pass over the parser's events refuses a
document nested deeper than `MAX_DEPTH` or holding more than `MAX_NODES` values once its aliases
are expanded (`dlu_api.spec.plain`), so neither recursion nor an alias bomb can blow up.
"""

from __future__ import annotations

import bisect
import json
import re
from collections import defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, cast

import yaml
from yaml.events import (
    AliasEvent,
    CollectionEndEvent,
    CollectionStartEvent,
    NodeEvent,
    StreamEndEvent,
)
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from dlu_api.spec.plain import MAX_DEPTH, MAX_NODES, depth_error, nodes_error, too_big

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


_BaseLoader: type[yaml.SafeLoader] = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
_NUMBER_TAGS = ("tag:yaml.org,2002:int", "tag:yaml.org,2002:float")


class _Loader(_BaseLoader):  # pyright: ignore[reportGeneralTypeIssues, reportUntypedBaseClass]
    """The safe loader, except that a plain scalar with a colon is never a (base-60) number."""


_Loader.yaml_implicit_resolvers = {
    first: [
        (tag, re.compile(r"(?!.*:)(?:" + regex.pattern + ")", regex.flags) if tag in _NUMBER_TAGS else regex)
        for tag, regex in resolvers
    ]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}


def _check_events(text: str, source: str) -> None:
    """Refuse too deep a document, or too many values with aliases expanded, from its events.

    Raises:
        SpecError: past `MAX_DEPTH` or `MAX_NODES`, or an alias inside its own anchor.
        yaml.YAMLError: the text does not parse.
    """
    parser = _Loader(text)
    count = 0
    open_: list[tuple[str | None, int]] = []  # the collections being read: anchor, count at start
    sizes: dict[str, int] = {}  # values under each anchor, aliases expanded
    try:
        while True:
            event = parser.get_event()  # pyright: ignore[reportUnknownMemberType, reportUnknownVariableType]
            if isinstance(event, StreamEndEvent):
                return
            if isinstance(event, AliasEvent):
                anchor = str(event.anchor)
                if any(name == anchor for name, _ in open_):
                    raise too_big(
                        f"{source} uses the alias *{anchor} inside the value it names, a value "
                        "that holds itself",
                        "no self-reference",
                        f"write the value out instead of *{anchor}.",
                    )
                count += sizes.get(anchor, 1)
            elif isinstance(event, NodeEvent):
                count += 1
                if isinstance(event, CollectionStartEvent):
                    open_.append((event.anchor, count - 1))
                    if len(open_) > MAX_DEPTH:
                        raise depth_error(source)
                elif event.anchor is not None:
                    sizes[event.anchor] = 1
            elif isinstance(event, CollectionEndEvent):
                anchor, start = open_.pop()
                if anchor is not None:
                    sizes[anchor] = count - start
            if count > MAX_NODES:
                raise nodes_error(source)
    finally:
        parser.dispose()  # pyright: ignore[reportUnknownMemberType]


def load_yaml(text: str, source: str = "the spec") -> tuple[Any, list[DuplicateKey]]:
    """The document's data (last value wins, as `yaml.safe_load`) and its duplicate keys.

    Raises:
        yaml.YAMLError: the text is not one YAML document.
        SpecError: the document is past one of the reader's limits.
    """
    _check_events(text, source)
    loader = _Loader(text)
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


_JSON_TOKEN = re.compile(r'"(?:[^"\\]|\\.)*"|[\[\]{}]')


def load_json(text: str, source: str = "the spec") -> tuple[Any, list[DuplicateKey]]:
    """The document's data (last value wins, as `json.loads`) and its duplicate keys.

    Raises:
        json.JSONDecodeError: the text is not JSON.
        SpecError: nested deeper than `MAX_DEPTH` (checked before `json.loads` recurses).
    """
    depth = 0
    for match in _JSON_TOKEN.finditer(text):
        token = match.group()
        if token in "[{":
            depth += 1
            if depth > MAX_DEPTH:
                raise depth_error(source)
        elif token in "]}":
            depth -= 1
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
