"""The release check (`scripts/release_check.py`): every package builds (wheel and sdist), and
the dlu-api wheel installed alone into a fresh venv runs `dlu --help`, `dlu schema` and
`dlu validate` there, without ray, torch or grpc."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

ROOT = Path(__file__).resolve().parents[2]


def test_release_check_builds_every_package_and_installs_dlu_api_alone(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "release_check.py"), "--keep", str(tmp_path / "release")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=580,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.splitlines()[-1] == "release check: ok"
    wheels = sorted(p.name.split("-")[0] for p in (tmp_path / "release" / "dist").glob("*.whl"))
    assert wheels == ["dlu_api", "dlu_brain", "dlu_elastic", "dlu_prime", "dlu_store_redis"]
    listed = (tmp_path / "release" / "venv" / "lib").glob("python*/site-packages/dlu_prime")
    assert not list(listed), "dlu-prime was installed with dlu-api"
