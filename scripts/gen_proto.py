"""Regenerate the checked-in protobuf/gRPC code of dlu-elastic from `proto/`.

Usage: `uv run python scripts/gen_proto.py [--out DIR]`.

Protos are compiled with `-I proto`, so `proto/dlu/elastic/v1/elastic.proto` becomes the module
`dlu.elastic.v1.elastic_pb2` and the generated gRPC module imports it by that name unchanged:
the output lands in `packages/dlu-elastic/src`, where `dlu/elastic/v1/` is a package of the
dlu-elastic wheel. `tests/unit/elastic/test_proto_drift.py` runs this script into a temporary
directory and fails when the checked-in files differ.
"""

from __future__ import annotations

import argparse
import sys
from importlib import resources
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
PROTO_ROOT = REPO_ROOT / "proto"
DEFAULT_OUT = REPO_ROOT / "packages" / "dlu-elastic" / "src"
GENERATED_SUFFIXES = ("_pb2.py", "_pb2_grpc.py", "_pb2.pyi")


def proto_files() -> list[Path]:
    """Every .proto under `proto/`, relative to it (protoc wants paths under an -I root)."""
    return sorted(p.relative_to(PROTO_ROOT) for p in PROTO_ROOT.rglob("*.proto"))


def expected_outputs(out: Path) -> list[Path]:
    """The files generation writes for the current protos."""
    stems = [out / p.with_suffix("") for p in proto_files()]
    return [stem.with_name(stem.name + suffix) for stem in stems for suffix in GENERATED_SUFFIXES]


def generate(out: Path) -> list[Path]:
    """Compile every proto into `out`; return the written files. Raises on a protoc error."""
    from grpc_tools import protoc  # dev dependency: only this script needs it

    protos = proto_files()
    if not protos:
        raise RuntimeError(f"no .proto files under {PROTO_ROOT}")
    out.mkdir(parents=True, exist_ok=True)
    well_known = resources.files("grpc_tools") / "_proto"
    args = [
        "grpc_tools.protoc",
        f"-I{PROTO_ROOT}",
        f"-I{well_known}",
        f"--python_out={out}",
        f"--pyi_out={out}",
        f"--grpc_python_out={out}",
        *(str(p) for p in protos),
    ]
    code = protoc.main(args)
    if code != 0:
        raise RuntimeError(f"protoc failed with exit code {code}: {' '.join(args)}")
    written = expected_outputs(out)
    missing = [str(p) for p in written if not p.is_file()]
    if missing:
        raise RuntimeError(f"protoc did not write {missing}")
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="Regenerate the protobuf/gRPC code of dlu-elastic from proto/."
    )
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="output root (default: %(default)s)")
    args = parser.parse_args(argv)
    for path in generate(args.out):
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
