"""Hostile spec files through `dlu validate`: nothing may crash, hang or blow up.

A seeded generator writes spec files from the JSON Schema that `dlu schema` prints (every field
given a value of its type, of another type, or a hostile one: booleans and text for numbers,
huge, negative, non-finite and non-ASCII numbers, lone surrogates, YAML 1.1 traps such as
`1:3` and dates), plus shapes that attack the reader itself: nesting 500 levels deep, alias
bombs, a 50 MB file, one 50 MB string, many keys, duplicate keys, non-UTF-8 bytes, tags.

Each file is validated in this process (the time of each, then tracemalloc's peak of each in a
second pass), and a sample through the real `dlu validate` command (its exit code and output).
A file passes when it is accepted, or refused with the clean error (exit 1, `problem(s)`), never
a traceback. The last line is the summary (N and T count the CLI runs too; S and M are of the
in-process runs, a CLI run's time being mostly Python's start):

    files N, tracebacks T, over 1 s S, max MB M

Usage: `uv run python benchmarks/spec_fuzz.py [--seed N] [--files N] [--cli N]`.
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import tempfile
import time
import tracemalloc
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

Data = Any
BIG = 50 * 1000 * 1000

_SURROGATE = "\ud800"
_HOSTILE_NUMBERS: list[Any] = [
    True, False, -1, 0, 2**63, 10**6, -(2**63), 1e308, "1_0", "٣", "1:3", "", " ", None, "NaN",
]  # fmt: skip
_HOSTILE_TEXT: list[Any] = [
    "", " ", _SURROGATE, "a\x00b", "é" * 3, "\u202e", "x" * 300, 0, 1.5, True, None, [], {}, "*a",
]  # fmt: skip


@dataclass(frozen=True)
class Case:
    """One generated file: a name saying what it attacks, its suffix and its bytes."""

    name: str
    suffix: str
    content: bytes


def _resolve(schema: dict[str, Any], node: dict[str, Any]) -> dict[str, Any]:
    ref = node.get("$ref")
    if isinstance(ref, str):
        return schema["$defs"][ref.rsplit("/", 1)[-1]]
    options = node.get("anyOf")
    if isinstance(options, list):
        real = [o for o in options if o.get("type") != "null"]  # pyright: ignore[reportUnknownVariableType, reportUnknownMemberType]
        if real:
            return _resolve(schema, real[0])  # pyright: ignore[reportUnknownArgumentType]
    return node


def _value(schema: dict[str, Any], node: dict[str, Any], rng: random.Random, depth: int) -> Data:
    """A value for `node`: usually of its type, sometimes (at `rng.hostility`) hostile."""
    node = _resolve(schema, node)
    kind = node.get("type")
    if rng.random() < getattr(rng, "hostility", 0.1):
        pool = _HOSTILE_NUMBERS if kind in ("integer", "number") else _HOSTILE_TEXT
        return rng.choice(pool)
    if "const" in node:
        return node["const"]
    if "enum" in node:
        return rng.choice(node["enum"])
    if kind == "object" and "properties" in node and depth < 6:
        return _object(schema, node, rng, depth + 1)
    if kind == "object":
        extra = node.get("additionalProperties")
        values = _resolve(schema, extra) if isinstance(extra, dict) else {}
        if values.get("type") in ("string", "number", "integer"):
            return {f"K{i}": _value(schema, values, rng, depth + 1) for i in range(rng.randint(0, 3))}
        return {f"k{i}": rng.choice([1, "v", 2.5, None, [1, 2]]) for i in range(rng.randint(0, 3))}
    if kind == "array":
        items = node.get("items", {})
        return [_value(schema, items, rng, depth + 1) for _ in range(rng.randint(0, 3))]
    if kind == "integer":
        return rng.choice([0, 1, 2, 4, 8, rng.randint(-5, 100)])
    if kind == "number":
        return rng.choice([0.0, 0.5, 1.0, 30.0, float("inf"), rng.uniform(-1, 100)])
    if kind == "boolean":
        return rng.random() < 0.5
    if kind == "string":
        return rng.choice(["a", "worker", "pkg.mod:main", "train.py --lr 0.1", "2:4", "4GiB", "CPU"])
    return None


def _object(schema: dict[str, Any], node: dict[str, Any], rng: random.Random, depth: int) -> dict[str, Any]:
    props: dict[str, Any] = node.get("properties", {})
    required = set(node.get("required", []))
    out: dict[str, Any] = {}
    for key, sub in props.items():
        if key in required or rng.random() < 0.4:
            out[key] = _value(schema, sub, rng, depth)
    if rng.random() < getattr(rng, "hostility", 0.1):
        out[rng.choice(["colour", _SURROGATE, "speed", "nnodes"])] = 1
    return out


def _from_schema(schema: dict[str, Any], rng: random.Random) -> dict[str, Any]:
    rng.hostility = rng.choice([0.0, 0.0, 0.02, 0.1])  # pyright: ignore[reportAttributeAccessIssue]
    data = _object(schema, schema, rng, 0)
    if rng.random() < 0.7:  # most files start from a plausible job, so deeper fields are reached
        data["name"] = "fuzz"
        data["roles"] = [
            _object(schema, schema["$defs"]["RoleSpec"], rng, 1) | {"name": f"r{i}", "entrypoint": "m:f"}
            for i in range(rng.randint(1, 3))
        ]
    return data


def _yaml_text(data: Data, rng: random.Random) -> str:
    import yaml

    text = yaml.safe_dump(data, allow_unicode=rng.random() < 0.5, sort_keys=False)
    return text


def _dumped(name: str, data: Data, rng: random.Random) -> Case:
    if rng.random() < 0.5:
        return Case(name, ".json", json.dumps(data).encode("utf-8", "surrogatepass"))
    text = _yaml_text(data, rng)
    return Case(name, ".yaml", text.encode("utf-8", "surrogatepass"))


HEAD = "name: fuzz\ndevice_type: CPU\ndevice_per_node: 0\n"
ROLE = "roles:\n  - name: w\n    entrypoint: 'm:f'\n"


def hostile(big: int = BIG) -> Iterator[Case]:
    """The reader's own attacks, and each accepted-but-wrong value of issue 28, one file each."""
    deep = 500
    yield Case("deep-yaml-block", ".yaml", (HEAD + ROLE + "config:\n" + "".join(
        "  " * (i + 1) + f"k{i}:\n" for i in range(deep)) + "  " * (deep + 1) + "x\n").encode())  # fmt: skip
    yield Case(
        "deep-yaml-flow", ".yaml", (HEAD + ROLE + "config: " + "[" * deep + "]" * deep + "\n").encode()
    )
    yield Case(
        "deep-json",
        ".json",
        ('{"name": "fuzz", "config": ' + '{"a": ' * deep + "1" + "}" * (deep + 1)).encode(),
    )
    yield Case("deep-json-lists", ".json", ("[" * 100_000 + "]" * 100_000).encode())
    laughs = "".join(f"  l{i}: &l{i} [" + ", ".join([f"*l{i - 1}"] * 9) + "]\n" for i in range(1, 10))
    yield Case("billion-laughs", ".yaml", (HEAD + ROLE + "config:\n  l0: &l0 [lol, lol, lol, lol, lol, lol, lol, lol, lol]\n" + laughs).encode())  # fmt: skip
    yield Case("self-alias", ".yaml", (HEAD + ROLE + "config: &c {a: *c}\n").encode())
    yield Case("merge-bomb", ".yaml", (HEAD + ROLE + "config:\n  b0: &b0 {a: 1, b: 2}\n" + "".join(
        f"  b{i}: &b{i} [*b{i - 1}, *b{i - 1}, *b{i - 1}, *b{i - 1}]\n" for i in range(1, 14))).encode())  # fmt: skip
    yield Case("big-file", ".yaml", (HEAD + ROLE + "config:\n" + "".join(
        f"  key{i}: value {i}\n" for i in range(big // 20))).encode()[:big])  # fmt: skip
    yield Case("big-string", ".yaml", (HEAD + ROLE + "config: {blob: '" + "x" * big + "'}\n").encode())
    yield Case("many-keys", ".yaml", (HEAD + ROLE + "config:\n" + "".join(
        f"  k{i}: {i}\n" for i in range(60_000))).encode())  # fmt: skip
    yield Case("surrogate-role", ".json", json.dumps({
        "name": "fuzz", "roles": [{"name": _SURROGATE, "entrypoint": "m:f"}], _SURROGATE: 1, "colour": 2,
        "speed": 3}).encode())  # fmt: skip
    yield Case("surrogate-yaml", ".yaml", (HEAD + ROLE + 'config: {"a": "\\uD800"}\n').encode())
    yield Case("sexagesimal-nnodes", ".yaml", (HEAD + "roles:\n  - {name: w, kind: elastic, entrypoint: 'm:f', elastic: {nnodes: 1:3}}\n").encode())  # fmt: skip
    yield Case("total-million", ".yaml", (HEAD + ROLE + "    total: 1000000\n").encode())
    yield Case("duplicate-and-more", ".yaml", (HEAD + ROLE + "name: again\nconfig: {start: 2024-01-01}\nbogus: 1\n").encode())  # fmt: skip
    yield Case("arabic-nnodes", ".yaml", (HEAD + "roles:\n  - {name: w, kind: elastic, entrypoint: 'm:f', elastic: {nnodes: '٣'}}\n").encode())  # fmt: skip
    yield Case("underscore-nnodes", ".yaml", (HEAD + "roles:\n  - {name: w, kind: elastic, entrypoint: 'm:f', elastic: {nnodes: '1_0'}}\n").encode())  # fmt: skip
    yield Case("node-num-2-63", ".yaml", (HEAD + ROLE + f"node_num: {2**63}\n").encode())
    yield Case("bool-interval", ".yaml", (HEAD + ROLE + "health: {heartbeat_interval_s: true}\n").encode())
    yield Case("inf-nan-timeouts", ".yaml", (HEAD + ROLE + "health: {heartbeat_timeout_s: .inf, monitor_interval_s: .nan}\n").encode())  # fmt: skip
    yield Case("empty-store-name", ".yaml", (HEAD + ROLE + "state_store: {name: ''}\n").encode())
    yield Case("latin1", ".yaml", (HEAD + ROLE).replace("fuzz", "f\xfczz").encode("latin-1"))
    yield Case(
        "python-tag", ".yaml", (HEAD + ROLE + "config: !!python/object/apply:os.system ['true']\n").encode()
    )
    yield Case(
        "binary-and-set", ".yaml", (HEAD + ROLE + "config: {b: !!binary aGk=, s: !!set {a, b}}\n").encode()
    )
    yield Case("not-a-mapping", ".yaml", b"- a\n- b\n")
    yield Case("empty", ".yaml", b"")
    yield Case("nul-bytes", ".yaml", b"name: \x00\x00\n")
    yield Case("two-documents", ".yaml", (HEAD + "---\n" + HEAD).encode())


def generate(seed: int, files: int, big: int = BIG) -> Iterator[Case]:
    """The hostile cases, then schema-driven ones up to `files` in all (seeded: same files)."""
    from dlu_api.spec.io import job_schema

    rng = random.Random(seed)
    count = 0
    for case in hostile(big):
        if count >= files:
            return
        count += 1
        yield case
    schema = job_schema()
    while count < files:
        data = _from_schema(schema, rng)
        count += 1
        yield _dumped(f"schema-{count}", data, rng)


@dataclass(frozen=True)
class Outcome:
    name: str
    verdict: str  # "ok", "refused" or "traceback"
    seconds: float
    peak_mb: float
    detail: str = ""


def validate_once(path: Path, check: Callable[[Path], None]) -> tuple[str, str]:
    """('ok' | 'refused' | 'traceback', what was said) for one file, as `dlu validate` sees it."""
    from dlu_api.errors import SpecError

    try:
        check(path)
    except SpecError as exc:
        str(exc).encode("utf-8")  # what validate prints must be printable
        return "refused", str(exc)[:300]
    except BaseException as exc:  # any other exception is the finding
        return "traceback", f"{type(exc).__name__}: {str(exc)[:300]}"
    return "ok", ""


def run_in_process(paths: list[tuple[str, Path]]) -> list[Outcome]:
    """Each file validated twice: timed alone, then under tracemalloc for its peak memory."""
    from dlu_api.cli.spec_commands import check_file

    out: list[Outcome] = []
    for name, path in paths:
        started = time.perf_counter()
        verdict, detail = validate_once(path, check_file)
        seconds = time.perf_counter() - started
        tracemalloc.start()
        try:
            validate_once(path, check_file)
            peak = tracemalloc.get_traced_memory()[1] / 1e6
        finally:
            tracemalloc.stop()
        out.append(Outcome(name, verdict, seconds, peak, detail))
    return out


def run_cli(paths: list[tuple[str, Path]]) -> list[Outcome]:
    """Files through the real `dlu validate`: exit 0 or 1, and never a traceback."""
    dlu = Path(sys.executable).parent / "dlu"
    out: list[Outcome] = []
    for name, path in paths:
        started = time.perf_counter()
        done = subprocess.run([str(dlu), "validate", str(path)], capture_output=True, text=True, timeout=120)
        seconds = time.perf_counter() - started
        said = done.stdout + done.stderr
        clean = done.returncode in (0, 1) and "Traceback" not in said
        verdict = ("ok" if done.returncode == 0 else "refused") if clean else "traceback"
        out.append(Outcome(f"cli:{name}", verdict, seconds, 0.0, said[-300:]))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=28)
    parser.add_argument("--files", type=int, default=500)
    parser.add_argument("--cli", type=int, default=12, help="the first N files also through `dlu validate`")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="dlu-spec-fuzz-") as folder:
        paths: list[tuple[str, Path]] = []
        for index, case in enumerate(generate(args.seed, args.files)):
            path = Path(folder) / f"{index:04d}-{case.name}{case.suffix}"
            path.write_bytes(case.content)
            paths.append((case.name, path))
        results = run_in_process(paths)
        cli = run_cli(paths[: args.cli])  # the reader's own attacks come first
    for result in results + cli:  # a CLI run's time includes starting Python: not counted
        if result.verdict == "traceback" or (result in results and result.seconds > 1.0):
            print(f"{result.name}: {result.verdict} in {result.seconds:.2f} s: {result.detail}")
    refused = sum(r.verdict == "refused" for r in results)
    print(f"in process: {len(results)} files, {refused} refused, {len(results) - refused} accepted")
    slowest = max(results, key=lambda r: r.seconds)
    print(f"slowest: {slowest.name} {slowest.seconds:.3f} s; cli: {len(cli)} files, slowest "
          f"{max((r.seconds for r in cli), default=0.0):.2f} s (a process start included)")  # fmt: skip
    everything = results + cli
    tracebacks = sum(r.verdict == "traceback" for r in everything)
    over = sum(r.seconds > 1.0 for r in results)
    max_mb = max(r.peak_mb for r in results)
    print(f"files {len(everything)}, tracebacks {tracebacks}, over 1 s {over}, max MB {max_mb:.1f}")


if __name__ == "__main__":
    main()
