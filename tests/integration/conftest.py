"""Environments built from the wheels, a multi-node Ray cluster with a job server, and a `dlu`
home per test (`box`).

Session-scoped and built on first use only: the wheels of `uv build --all-packages`, a
*cluster* environment (those wheels plus `ray[default]`, as a cluster image has) and a
*driver* environment (the dlu-api wheel alone). Third-party versions are pinned to uv.lock
(the `cluster` dependency group locks Ray's default extras).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from cli_runs import Box
from wheel_envs import RayCluster, Venv, cluster_env, make_venv, run_ok

HERE = Path(__file__).parent
PACKAGES = ("dlu_api", "dlu_prime", "dlu_elastic", "dlu_store_redis")


@pytest.fixture
def box(tmp_path: Path) -> Iterator[Box]:
    """A `dlu` home of the test's own (`cli_runs.Box`), its runs ended after the test."""
    made = Box(tmp_path / "home")
    try:
        yield made
    finally:
        made.end()


@pytest.fixture(scope="session")
def wheel_dist(tmp_path_factory: pytest.TempPathFactory, repo_root: Path, uv_bin: str) -> Path:
    dist = tmp_path_factory.mktemp("dist")
    run_ok(uv_bin, "build", "--all-packages", "--wheel", "-q", "-o", dist, cwd=repo_root)
    return dist


@pytest.fixture(scope="session")
def lock_constraints(tmp_path_factory: pytest.TempPathFactory, repo_root: Path, uv_bin: str) -> Path:
    out = tmp_path_factory.mktemp("constraints") / "constraints.txt"
    run_ok(
        uv_bin, "export", "--frozen", "--all-packages", "--group", "cluster", "--no-emit-workspace",
        "--no-hashes", "--no-header", "-q", "-o", out, cwd=repo_root,
    )  # fmt: skip
    return out


@pytest.fixture(scope="session")
def cluster_venv(
    tmp_path_factory: pytest.TempPathFactory, wheel_dist: Path, lock_constraints: Path, uv_bin: str
) -> Venv:
    """What a cluster image holds: our four wheels and `ray[default]` (job server, dashboard);
    the Brain's wheel is not in it (it runs on one machine per cluster)."""
    wheels = sorted(w for w in wheel_dist.glob("*.whl") if w.name.split("-")[0] in PACKAGES)
    assert [w.name.split("-")[0] for w in wheels] == sorted(PACKAGES)
    root = tmp_path_factory.mktemp("cluster-env") / "venv"
    return make_venv(uv_bin, root, lock_constraints, *wheels, "ray[default]")


@pytest.fixture(scope="session")
def driver_venv(
    tmp_path_factory: pytest.TempPathFactory, wheel_dist: Path, lock_constraints: Path, uv_bin: str
) -> Venv:
    """A driver machine: the dlu-api wheel and its light dependencies, nothing else."""
    (api_wheel,) = wheel_dist.glob("dlu_api-*.whl")
    root = tmp_path_factory.mktemp("driver-env") / "venv"
    return make_venv(uv_bin, root, lock_constraints, api_wheel)


def _stop_group(process: subprocess.Popen[str]) -> None:
    """Close stdin (the holder shuts its cluster down), then end its process group by id."""
    if process.stdin is not None:
        process.stdin.close()
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(timeout=30)
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(process.pid, sig)
        except ProcessLookupError:
            return
        time.sleep(1.0)


def _wait_for_job_server(url: str, timeout_s: float = 60.0) -> None:
    import httpx

    deadline = time.monotonic() + timeout_s
    while True:
        try:
            if httpx.get(f"{url}/api/jobs/", timeout=5).status_code == 200:
                return
        except httpx.TransportError:
            pass
        assert time.monotonic() < deadline, f"no job server at {url}"
        time.sleep(0.5)


@contextlib.contextmanager
def _started_cluster(cluster_venv: Venv, repo_root: Path, workdir: Path) -> Iterator[RayCluster]:
    """A head (PrimeMaster resource `dlu_head`) and two worker nodes (`dlu_worker`), one Ray."""
    shutil.copytree(repo_root / "examples", workdir / "examples")
    tmp_dir = tempfile.mkdtemp(prefix="r7", dir="/tmp")  # Ray's socket paths must stay short
    log = (workdir / "holder.log").open("w")
    process = subprocess.Popen(
        [str(cluster_venv.python), str(HERE / "cluster_holder.py"), json.dumps({"workers": 2})],
        cwd=workdir,
        env=cluster_env(cluster_venv, tmp_dir),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=log,
        text=True,
        start_new_session=True,
    )
    try:
        assert process.stdout is not None
        first = process.stdout.readline()
        assert first, f"the cluster did not start:\n{(workdir / 'holder.log').read_text()[-4000:]}"
        info = json.loads(first)
        _wait_for_job_server(info["dashboard"])
        yield RayCluster(
            info["dashboard"], info["head_node"], info["worker_nodes"], workdir, info["metrics_ports"]
        )
    finally:
        _stop_group(process)
        log.close()
        shutil.rmtree(tmp_dir, ignore_errors=True)


def _used_after(module_path: Path, session: pytest.Session, fixture: str) -> bool:
    """Whether a test after the last one of the module at `module_path` asks for `fixture`."""
    items = session.items
    last = max((i for i, item in enumerate(items) if item.path == module_path), default=len(items))
    return any(fixture in getattr(item, "fixturenames", ()) for item in items[last + 1 :])


@dataclass
class _ClusterHolder:
    """`ray_cluster`'s cluster between modules, and what stops it."""

    stack: contextlib.ExitStack = field(default_factory=contextlib.ExitStack)
    cluster: RayCluster | None = None

    def stop(self) -> None:
        self.cluster = None
        self.stack.close()  # empty again, ready for a later start


@pytest.fixture(scope="session")
def _cluster_holder() -> Iterator[_ClusterHolder]:
    holder = _ClusterHolder()
    yield holder
    holder.stop()  # one still running


@pytest.fixture(scope="module")
def ray_cluster(
    request: pytest.FixtureRequest,
    _cluster_holder: _ClusterHolder,
    cluster_venv: Venv,
    repo_root: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[RayCluster]:
    """A head (`dlu_head`) and two worker nodes (`dlu_worker`), one Ray: one cluster for the
    modules that ask for it one after another (a start costs seconds of CPU), stopped after the
    last of them."""
    holder = _cluster_holder
    if holder.cluster is None:
        workdir = tmp_path_factory.mktemp("cluster-workdir")
        holder.cluster = holder.stack.enter_context(_started_cluster(cluster_venv, repo_root, workdir))
    yield holder.cluster
    if not _used_after(request.path, request.session, "ray_cluster"):
        holder.stop()
