"""Private Ray is used in one module only (dlu_prime/ray_private.py, where each symbol is checked):
no other source of the packages names it."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(60)

ROOT = Path(__file__).resolve().parents[2]
GUARD = ROOT / "packages/dlu-prime/src/dlu_prime/ray_private.py"
# Text that names Ray internals, in code or in a string (module paths, path parts, known names).
PATTERNS = [
    re.compile(r"\bray(\.\w+)*\._[A-Za-z]"),  # ray._private, ray._raylet, internal_kv._internal_kv_get
    re.compile(r"_internal_kv"),
    re.compile(r"[\"']_(private|raylet)[\"']"),  # a path built to Ray's private folder
    re.compile(r"\b(global_worker|_global_node|core_worker|was_current_actor_reconstructed)\b"),
    # private attributes of Ray actor handles and methods
    re.compile(r"\b(handle|actor)\._\w+|\._ray_(actor|method|metadata)\w*|\.__ray_\w+"),
]


def _sources() -> list[Path]:
    found = sorted(p for p in ROOT.glob("packages/*/src/**/*.py") if p != GUARD)
    assert len(found) > 20 and GUARD.is_file(), "the package sources are not where this test looks"
    return found


def _private_ray_uses(tree: ast.AST) -> list[tuple[int, str]]:
    """Imports of private Ray modules or names, and underscore attributes of anything bound to a
    Ray import (`ray._x`, `from ray.experimental import internal_kv; internal_kv._y`)."""
    from_ray: set[str] = set()
    hits: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "ray":
                    from_ray.add((alias.asname or alias.name).split(".")[0])
                    if any(part.startswith("_") for part in alias.name.split(".")):
                        hits.append((node.lineno, f"import {alias.name}"))
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "ray":
            module = node.module or ""
            for alias in node.names:
                from_ray.add(alias.asname or alias.name)
                if any(part.startswith("_") for part in [*module.split("."), alias.name]):
                    hits.append((node.lineno, f"from {module} import {alias.name}"))
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__"):
            root: ast.expr = node.value
            while isinstance(root, ast.Attribute):
                root = root.value
            if isinstance(root, ast.Name) and root.id in from_ray:
                hits.append((node.lineno, f"{ast.unparse(node)}"))
    return hits


def test_no_private_ray_outside_the_guarded_module() -> None:
    found: list[str] = []
    for path in _sources():
        text = path.read_text(encoding="utf-8")
        where = path.relative_to(ROOT)
        for number, line in enumerate(text.splitlines(), 1):
            if any(p.search(line) for p in PATTERNS):
                found.append(f"{where}:{number}: {line.strip()}")
        found.extend(f"{where}:{n}: {what}" for n, what in _private_ray_uses(ast.parse(text)))
    listing = "\n".join(found)
    assert not found, f"private Ray outside dlu_prime/ray_private.py (move it there, guarded):\n{listing}"


def test_the_check_sees_private_ray() -> None:
    sample = "import ray\nfrom ray.experimental import internal_kv\ninternal_kv._get('k')\nray._private.x\n"
    assert [n for n, _ in _private_ray_uses(ast.parse(sample))] == [3, 4]
    assert any(p.search("from ray._raylet import PlacementGroupID") for p in PATTERNS)
    assert any(p.search('os.path.join(base, "_private", "workers")') for p in PATTERNS)
