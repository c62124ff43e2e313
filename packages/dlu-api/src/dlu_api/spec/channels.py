"""A data channel that a role reads and no role of the job writes, found from the roles' source.

A role that waits on such a channel waits forever, and a job of such roles sits at step 0 with
nothing failing. Channels are named in code (`channel("raw").get(...)`), not in the spec, so the
roles' Python source is read (never imported: importing user code can start anything) and each
entrypoint function, with the functions of its module that it calls, is searched for
`channel("<name>")` and the calls made on it: `get`/`iterate` read, `put`/`put_many`/`close`
write. Only what is certain is reported: when a role's code cannot be read, a channel name is not
a literal, a channel object is handed on (to a helper, a return value, an attribute), or a role
has a SubMaster of its own, the job might write any channel, and nothing is said.
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from dlu_api.errors import Problem
from dlu_api.source_tree import parse_source
from dlu_api.spec.entrypoint import EntrypointKind, parse_entrypoint
from dlu_api.spec.models import JobSpec
from dlu_api.spec.plain import MAX_SPEC_BYTES
from dlu_api.spec.torchrun import parse_torchrun

_READS = frozenset({"get", "iterate"})
_WRITES = frozenset({"put", "put_many", "close"})
_HARMLESS = frozenset({"ack", "restore", "next_seq", "stats", "config", "destroy"})
_MAX_SOURCE = 4 * MAX_SPEC_BYTES  # a source file larger than this is not read


@dataclass
class Use:
    """What one role's code does with channels: reads and writes by name, with a line each."""

    reads: dict[str, int] = field(default_factory=dict[str, int])
    writes: dict[str, int] = field(default_factory=dict[str, int])
    unknown: bool = False  # a name not written out, or a channel handed on: could be anything


def module_file(module: str, roots: Iterable[str]) -> Path | None:
    """The source file of `module` under one of `roots`, found without importing anything."""
    parts = module.split(".")
    for root in roots:
        base = Path(root or ".").joinpath(*parts)
        for candidate in (base.with_suffix(".py"), base / "__init__.py"):
            if candidate.is_file():
                return candidate
    return None


def _read_tree(path: Path) -> tuple[str, ast.Module] | None:
    try:
        if path.stat().st_size > _MAX_SOURCE:
            return None
        source = path.read_text(encoding="utf-8")
        return source, parse_source(source, str(path))
    except (OSError, SyntaxError, ValueError, RecursionError):
        return None


def _constructor_names(tree: ast.Module) -> set[str]:
    names = {"channel"}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            names.update(alias.asname for alias in node.names if alias.name == "channel" and alias.asname)
    return names


class _Finder:
    """Channel uses in one module's functions, following calls to the module's own functions."""

    def __init__(self, tree: ast.Module) -> None:
        self.tree = tree
        self.functions = {
            node.name: node for node in tree.body if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        }
        self.makers = _constructor_names(tree)
        self.use = Use()
        self.seen: set[str] = set()
        self.assigned: set[int] = set()  # channel calls whose result is bound to a name

    def _channel_name(self, node: ast.AST) -> str | bool | None:
        """A call `channel("x", ...)`: "x"; `channel(name)`: None; anything else: False."""
        if not isinstance(node, ast.Call):
            return False
        func = node.func
        is_maker = (isinstance(func, ast.Name) and func.id in self.makers) or (
            isinstance(func, ast.Attribute) and func.attr == "channel"
        )
        if not is_maker:
            return False
        first = node.args[0] if node.args else None
        if isinstance(first, ast.Constant) and isinstance(first.value, str):
            return first.value
        return None

    def scan(self, body: list[ast.stmt]) -> None:
        bound: dict[str, str] = {}
        for node in (n for stmt in body for n in ast.walk(stmt)):
            if isinstance(node, ast.Assign):
                for target in node.targets:
                    self._bind(target, node.value, bound)
        for stmt in body:
            self._uses(stmt, bound)

    def _bind(self, target: ast.expr, value: ast.expr, bound: dict[str, str]) -> None:
        if isinstance(target, ast.Tuple) and isinstance(value, ast.Tuple):
            for one, other in zip(target.elts, value.elts, strict=False):
                self._bind(one, other, bound)
            return
        name = self._channel_name(value)
        if name is False:
            return
        self.assigned.add(id(value))
        if name is None:
            self.use.unknown = True
        elif isinstance(target, ast.Name) and isinstance(name, str):
            bound[target.id] = name
        else:
            self.use.unknown = True  # kept somewhere this walk does not follow

    def _uses(self, stmt: ast.stmt, bound: dict[str, str]) -> None:
        calls: set[int] = set()  # the channel expressions used as `<it>.method(...)`
        for node in ast.walk(stmt):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
                owner = node.func.value
                name = bound.get(owner.id) if isinstance(owner, ast.Name) else None
                direct = self._channel_name(owner)
                if isinstance(direct, str):
                    name = direct
                if name is not None:
                    calls.add(id(owner))
                    self._record(node.func.attr, name, node.lineno)
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
                callee = self.functions.get(node.func.id)
                if callee is not None and callee.name not in self.seen:
                    self.seen.add(callee.name)
                    self.scan(callee.body)
        for node in ast.walk(stmt):
            handed_on = isinstance(node, ast.Name) and node.id in bound and isinstance(node.ctx, ast.Load)
            made = self._channel_name(node)
            if made is None or (made is not False and id(node) not in calls | self.assigned):
                handed_on = True  # a name not written out, or a new channel passed somewhere
            if handed_on and id(node) not in calls:
                self.use.unknown = True

    def _record(self, method: str, name: str, line: int) -> None:
        if method in _READS:
            self.use.reads.setdefault(name, line)
        elif method in _WRITES:
            self.use.writes.setdefault(name, line)
        elif method not in _HARMLESS:
            self.use.unknown = True


def role_use(entrypoint: str, roots: list[str]) -> tuple[Use, Path] | None:
    """The channels a role's code reads and writes, or None where its code cannot be read."""
    try:
        entry = parse_entrypoint(entrypoint)
        if entry.kind is EntrypointKind.TORCHRUN:
            entry = parse_entrypoint(parse_torchrun(entrypoint).entrypoint)
    except ValueError:
        return None
    if entry.kind is EntrypointKind.OBJECT:
        path = module_file(entry.module, roots)
    elif entry.kind is EntrypointKind.MODULE:
        path = module_file(entry.target, roots)
    elif entry.kind is EntrypointKind.SCRIPT and entry.target.endswith(".py"):
        script = Path(entry.target)
        found = [Path(root or ".") / script for root in roots[:1]] if not script.is_absolute() else [script]
        path = next((p for p in found if p.is_file()), None)
    else:
        return None
    read = _read_tree(path) if path is not None else None
    if path is None or read is None:
        return None
    source, tree = read
    if "channel" not in source:
        # No name the finder follows (`channel`, an alias imported as `channel`, `x.channel`)
        # can appear: nothing to walk. A training script's walk costs 0.1 s of a `dlu run`'s CPU
        # before Ray starts (16,000 nodes, some several times over).
        return Use(), path
    finder = _Finder(tree)
    if entry.kind is EntrypointKind.OBJECT:
        function = finder.functions.get(entry.attr)
        if function is None:
            return None
        finder.seen.add(function.name)
        finder.scan(function.body)
    else:
        finder.scan(tree.body)
    return finder.use, path


def channel_problems(spec: JobSpec, workdir: str | None) -> list[Problem]:
    """Each channel that a role reads and no role writes, naming the role that would wait on it.

    `workdir`: where the job's code is (relative scripts and modules are found there first).
    """
    roots = [workdir or ".", *sys.path]
    uses: dict[str, tuple[Use, Path]] = {}
    for role in spec.roles:
        found = role_use(role.entrypoint, roots)
        if found is None or found[0].unknown or role.sub_master is not None:
            return []  # a role (or its own SubMaster) that might write anything
        uses[role.name] = found
    written = {name for use, _ in uses.values() for name in use.writes}
    return list(_waits(uses, written))


def _waits(uses: dict[str, tuple[Use, Path]], written: set[str]) -> Iterator[Problem]:
    for role, (use, path) in uses.items():
        for name, line in use.reads.items():
            if name in written:
                continue
            field_name = f"roles[{role}].entrypoint"
            yield Problem(
                field_name,
                f"role {role!r} reads the data channel {name!r} ({path}:{line}), which no role of "
                f"the job writes (put), so {role!r} would wait on it forever.",
                f"add the role that writes {name!r} (its code calls channel({name!r}).put(...)), "
                f"or stop reading {name!r} in {field_name}.",
            )
