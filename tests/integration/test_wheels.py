"""The four wheels install and work in a fresh environment, without the workspace.

The cluster environment of `conftest.py` is built from the wheels alone; the reference job
running on it across Ray nodes is in `test_remote_cluster.py`.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from wheel_envs import Venv, run_ok

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

MODULES = (
    "dlu_api", "dlu_prime", "dlu_elastic", "dlu_store_redis",
    "dlu.elastic.v1.elastic_pb2_grpc", "dlu_elastic.master", "dlu_elastic.worker.actor",
)  # fmt: skip


def test_built_wheels_install_and_import(cluster_venv: Venv, tmp_path: Path) -> None:
    code = (
        "import importlib, sys\n"
        f"for name in {MODULES!r}:\n"
        "    module = importlib.import_module(name)\n"
        "    assert '/packages/' not in module.__file__, module.__file__\n"
        "print('imported')\n"
    )
    assert "imported" in run_ok(cluster_venv.python, "-c", code, cwd=tmp_path)
    assert "validate" in run_ok(cluster_venv.bin / "dlu", "--help", cwd=tmp_path)
    assert "launch" in run_ok(cluster_venv.python, "-m", "dlu_prime", "--help", cwd=tmp_path)
