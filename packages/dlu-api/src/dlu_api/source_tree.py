"""Python sources parsed into syntax trees, one at a time in a process.

CPython 3.11 keeps the recursion depth of the tree it builds from a parse per interpreter, not
per thread: two threads parsing at once (a thread switch while the tree's objects are allocated)
can fail with `SystemError: AST constructor recursion depth mismatch`. Seen: jobs submitted from
four threads at once, each pre-flight reading the roles' sources. Hence one lock."""

from __future__ import annotations

import ast
import threading

_PARSE = threading.Lock()


def parse_source(source: str, filename: str = "<unknown>") -> ast.Module:
    """`ast.parse`, serialised. Raises what it raises (SyntaxError, ValueError, RecursionError)."""
    with _PARSE:
        return ast.parse(source, filename)
