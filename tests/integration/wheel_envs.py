"""Helpers for tests that build environments from the wheels and run a Ray cluster in them."""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass, field
from pathlib import Path


def run_ok(*cmd: str | Path, cwd: Path | None = None, env: dict[str, str] | None = None) -> str:
    done = subprocess.run(
        [str(c) for c in cmd], cwd=cwd, env=env, capture_output=True, text=True, check=False, timeout=600
    )
    assert done.returncode == 0, f"{cmd} failed:\n{done.stdout}\n{done.stderr}"
    return done.stdout


@dataclass(frozen=True)
class Venv:
    root: Path

    @property
    def bin(self) -> Path:
        return self.root / "bin"

    @property
    def python(self) -> Path:
        return self.bin / "python"


def make_venv(uv_bin: str, root: Path, constraints: Path, *requirements: str | Path) -> Venv:
    venv = Venv(root)
    run_ok(uv_bin, "venv", "-q", root)
    env = {**os.environ, "UV_COMPILE_BYTECODE": "1"}  # this machine sets PYTHONDONTWRITEBYTECODE
    env.pop("VIRTUAL_ENV", None)
    run_ok(uv_bin, "pip", "install", "-q", "--python", venv.python, "-c", constraints, *requirements, env=env)
    return venv


@dataclass(frozen=True)
class RayCluster:
    address: str  # the job server URL
    head_node: str
    worker_nodes: list[str]
    workdir: Path  # where entrypoints run: holds a copy of examples/, nothing else of the repo
    metrics_ports: dict[str, int] = field(default_factory=dict)  # node id -> Prometheus port


def cluster_env(venv: Venv, tmp_dir: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH")}
    env.update(
        {
            "PATH": f"{venv.bin}{os.pathsep}{env.get('PATH', '')}",  # `python` of entrypoints
            "RAY_TMPDIR": tmp_dir,
            "RAY_AUTH_MODE": "disabled",
            "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",  # every Ray process on 127.0.0.1
            "RAY_ENABLE_UV_RUN_RUNTIME_ENV": "0",
            "RAY_USAGE_STATS_ENABLED": "0",
        }
    )
    return env
