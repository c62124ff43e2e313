"""The checked-in gRPC code matches `proto/` and sits where its own imports expect it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(120)

GENERATED_ROOT = Path("packages/dlu-elastic/src")
FIX = "run `uv run python scripts/gen_proto.py` and commit the result"


def _generated_files(root: Path) -> dict[str, bytes]:
    patterns = ("*_pb2.py", "*_pb2_grpc.py", "*_pb2.pyi")
    return {
        str(path.relative_to(root)): path.read_bytes()
        for pattern in patterns
        for path in (root / "dlu").rglob(pattern)
    }


def test_checked_in_code_matches_the_protos(tmp_path: Path, repo_root: Path) -> None:
    done = subprocess.run(
        [sys.executable, str(repo_root / "scripts" / "gen_proto.py"), "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, f"scripts/gen_proto.py failed:\n{done.stdout}\n{done.stderr}"
    fresh = _generated_files(tmp_path)
    checked_in = _generated_files(repo_root / GENERATED_ROOT)
    assert fresh, "scripts/gen_proto.py generated nothing"

    missing = sorted(fresh.keys() - checked_in.keys())
    stale = sorted(checked_in.keys() - fresh.keys())
    differ = sorted(name for name in fresh.keys() & checked_in.keys() if fresh[name] != checked_in[name])
    problems = [
        *(f"missing: {GENERATED_ROOT / name}" for name in missing),
        *(f"no longer generated (delete it): {GENERATED_ROOT / name}" for name in stale),
        *(f"out of date: {GENERATED_ROOT / name}" for name in differ),
    ]
    assert not problems, "generated gRPC code drifted from proto/; " + FIX + ":\n  " + "\n  ".join(problems)


def test_generated_package_path_matches_the_proto_package(repo_root: Path) -> None:
    """`dlu` and `dlu.elastic` are namespace packages so the wheel can ship `dlu.elastic.v1`."""
    src = repo_root / GENERATED_ROOT
    assert (src / "dlu/elastic/v1/__init__.py").is_file()
    assert not (src / "dlu/__init__.py").exists(), "dlu/ must stay a namespace package"
    assert not (src / "dlu/elastic/__init__.py").exists(), "dlu/elastic/ must stay a namespace package"

    from dlu.elastic.v1 import elastic_pb2, elastic_pb2_grpc

    assert elastic_pb2.DESCRIPTOR.package == "dlu.elastic.v1"
    assert elastic_pb2_grpc.ElasticServiceStub is not None
    service = elastic_pb2.DESCRIPTOR.services_by_name["ElasticService"]
    assert sorted(service.methods_by_name) == [
        "GetRendezvous",
        "Heartbeat",
        "JoinRendezvous",
        "ReportFailure",
        "ReportNodeCheck",
    ]


def test_every_request_carries_the_token_and_per_round_requests_the_round() -> None:
    from dlu.elastic.v1 import elastic_pb2

    service = elastic_pb2.DESCRIPTOR.services_by_name["ElasticService"]
    for method in service.methods:
        fields = method.input_type.fields_by_name
        assert "job_token" in fields, f"{method.name} request has no job_token"
        if method.name != "JoinRendezvous":
            assert "round" in fields, f"{method.name} request has no round"
