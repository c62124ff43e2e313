"""A state store written outside the repository, as docs/state-stores.md tells a store author:
a tiny package (a JSON file per job, compare-and-set under a file lock) is built and installed
into a directory of its own, found by name through its entry point, passes the conformance
suite dlu-prime ships, and holds the state of a real `dlu run` that selects it in the spec."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from cli_runs import DLU, HERE, Box

from dlu_api.status import JobStage
from dlu_prime.master.schema import SCHEMA_VERSION
from dlu_prime.master.state import JobState
from dlu_prime.state import StateStore, available_state_stores, create_state_store
from dlu_prime.testing.store_conformance import StateStoreConformance

pytestmark = pytest.mark.timeout(120)

PYPROJECT = """\
[project]
name = "dlu-store-jsonfile"
version = "0.1.0"
requires-python = ">=3.11"
dependencies = ["dlu-prime"]

[project.entry-points."dlu.state_stores"]
jsonfile = "dlu_store_jsonfile:JsonFileStateStore"

[build-system]
requires = ["uv_build>=0.8,<0.14"]
build-backend = "uv_build"
"""

STORE = '''\
"""One JSON file per job under `root`; a lock file makes each compare-and-set atomic across
processes (the PrimeMaster's actor and the `dlu` commands beside it)."""

from __future__ import annotations

import base64
import contextlib
import fcntl
import json
import os
from collections.abc import Iterator
from pathlib import Path

from dlu_prime.state import (
    StateConflictError,
    StateStore,
    StateStoreError,
    Versioned,
    describe_conflict,
    validate_data,
    validate_job,
    validate_token,
)


class JsonFileStateStore(StateStore):
    name = "jsonfile"

    def __init__(self, root: str) -> None:
        if not isinstance(root, str) or not root:
            raise ValueError(f"root must be a directory path, got {root!r}")
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)

    @contextlib.contextmanager
    def _locked(self, operation: str) -> Iterator[None]:
        try:
            with open(self.root / ".lock", "a") as lock:
                fcntl.flock(lock, fcntl.LOCK_EX)
                yield
        except OSError as exc:
            raise StateStoreError(self.name, operation, str(exc)) from exc

    def _read(self, job: str) -> Versioned | None:
        try:
            found = json.loads((self.root / f"{job}.json").read_text())
        except FileNotFoundError:
            return None
        return Versioned(base64.b64decode(found["data"]), int(found["token"]))

    def get(self, job: str) -> Versioned | None:
        validate_job(job)
        with self._locked(f"get of job {job!r}"):
            return self._read(job)

    def put(self, job: str, data: bytes, token: int | None) -> int:
        validate_job(job)
        validate_data(data)
        validate_token(token)
        operation = f"put of job {job!r}"
        with self._locked(operation):
            current = self._read(job)
            current_token = current.token if current else None
            if current_token != token:
                raise StateConflictError(self.name, operation, describe_conflict(token, current_token))
            new_token = 1 if token is None else token + 1
            body = {"token": new_token, "data": base64.b64encode(data).decode()}
            part = self.root / f".{job}.part"
            part.write_text(json.dumps(body))
            os.replace(part, self.root / f"{job}.json")
        return new_token

    def delete(self, job: str, token: int | None = None) -> None:
        validate_job(job)
        validate_token(token)
        operation = f"delete of job {job!r}"
        with self._locked(operation):
            current = self._read(job)
            if current is None:
                return
            if token is not None and current.token != token:
                raise StateConflictError(self.name, operation, describe_conflict(token, current.token))
            (self.root / f"{job}.json").unlink()

    def list_jobs(self) -> list[str]:
        with self._locked("list_jobs"):
            return sorted(p.stem for p in self.root.glob("*.json"))
'''

SPEC = """\
name: plugin-store
device_type: CPU
device_per_node: 0
health: {{monitor_interval_s: 0.2}}
state_store: {{name: jsonfile, options: {{root: {root}}}}}
roles:
  - name: script
    entrypoint: script_job.py --lr 1e-3 'two words'
    total: 2
    resources: {{cpu: 0.1}}
"""


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory, uv_bin: str) -> Iterator[Path]:
    """The package built and installed into a directory of its own (never the workspace's
    environment), which this process and the `dlu run` below put on their path."""
    base = tmp_path_factory.mktemp("plugin")
    source = base / "dlu-store-jsonfile"
    (source / "src" / "dlu_store_jsonfile").mkdir(parents=True)
    (source / "pyproject.toml").write_text(PYPROJECT)
    (source / "src" / "dlu_store_jsonfile" / "__init__.py").write_text(STORE)
    target = base / "site"
    command = [uv_bin, "pip", "install", "--no-deps", "--target", str(target), str(source)]
    command += ["--python", sys.executable]
    # The build backend is in uv's cache wherever the workspace was synced; else the registry.
    done = subprocess.run([*command, "--offline"], capture_output=True, text=True, timeout=120)
    if done.returncode != 0:
        done = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    with pytest.MonkeyPatch.context() as patch:
        patch.syspath_prepend(str(target))
        yield target


@pytest.mark.usefixtures("installed")
class TestJsonFileStoreConformance(StateStoreConformance):
    def create_store(self, tmp_path: Path) -> StateStore:
        return create_state_store("jsonfile", {"root": str(tmp_path / "states")})


def test_the_store_is_found_by_name_with_its_options(installed: Path, tmp_path: Path) -> None:
    assert "jsonfile" in available_state_stores()
    with pytest.raises(Exception, match="accepted options: root"):
        create_state_store("jsonfile", {"directory": str(tmp_path)})


@pytest.mark.ray
@pytest.mark.slow
@pytest.mark.timeout(240)
def test_a_job_runs_on_the_store_selected_in_its_spec(installed: Path, tmp_path: Path) -> None:
    root = tmp_path / "states"
    spec = tmp_path / "job.yaml"
    spec.write_text(SPEC.format(root=json.dumps(str(root))))
    box = Box(tmp_path / "home")
    try:
        path = os.pathsep.join(p for p in (str(installed), os.environ.get("PYTHONPATH")) if p)
        done = subprocess.run(
            [DLU, "run", str(spec)],
            cwd=HERE,
            env=box.env(box.new_dir("dlu-cli-"), PYTHONPATH=path),
            capture_output=True,
            text=True,
            timeout=200,
        )
    finally:
        box.end()
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert sorted(p.name for p in root.glob("*.json")) == ["plugin-store.json"]
    stored = create_state_store("jsonfile", {"root": str(root)}).get("plugin-store")
    assert stored is not None and stored.token > 3  # every stage change was a compare-and-set
    state = JobState.loads(stored.data)
    assert json.loads(stored.data)["schema_version"] == SCHEMA_VERSION
    assert (state.stage, state.exit_code) == (JobStage.STOPPED, 0), state.reason
    assert state.spec.state_store.name == "jsonfile"
    assert [a.stage.value for a in state.actors.values()] == ["FINISH", "FINISH"]
