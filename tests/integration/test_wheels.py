"""The four wheels install and work in a fresh environment, without the workspace."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

PACKAGES = ("dlu_api", "dlu_prime", "dlu_elastic", "dlu_store_redis")
MODULES = (*PACKAGES, "dlu.elastic.v1.elastic_pb2_grpc", "dlu_elastic.master", "dlu_elastic.worker.actor")


def _run(*cmd: str | Path, cwd: Path | None = None) -> str:
    done = subprocess.run([str(c) for c in cmd], cwd=cwd, capture_output=True, text=True, check=False)
    assert done.returncode == 0, f"{cmd} failed:\n{done.stdout}\n{done.stderr}"
    return done.stdout


def test_built_wheels_install_and_import(tmp_path: Path, repo_root: Path, uv_bin: str) -> None:
    dist = tmp_path / "dist"
    _run(uv_bin, "build", "--all-packages", "--wheel", "-o", dist, cwd=repo_root)
    wheels = sorted(dist.glob("*.whl"))
    assert [w.name.split("-")[0] for w in wheels] == sorted(PACKAGES)

    # Pin third-party versions to the lock so the install reuses what the workspace resolved.
    constraints = tmp_path / "constraints.txt"
    _run(
        uv_bin, "export", "--frozen", "--all-packages", "--no-emit-workspace", "--no-hashes",
        "--no-header", "-o", constraints, cwd=repo_root,
    )  # fmt: skip
    venv = tmp_path / "venv"
    _run(uv_bin, "venv", "-q", venv)
    python = venv / "bin" / "python"
    _run(uv_bin, "pip", "install", "-q", "--python", python, "-c", constraints, *wheels, cwd=tmp_path)

    code = (
        "import importlib, sys\n"
        f"for name in {MODULES!r}:\n"
        "    module = importlib.import_module(name)\n"
        "    assert '/packages/' not in module.__file__, module.__file__\n"
        "print('imported')\n"
    )
    assert "imported" in _run(python, "-c", code, cwd=tmp_path)
    assert "validate" in _run(venv / "bin" / "dlu", "--help", cwd=tmp_path)
