"""Shared test helpers: the repository root and the uv binary."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from short_tmp import remove_made, short_tmp_dir

REPO_ROOT = Path(__file__).resolve().parents[1]

# SIGALRM fails the one test past its timeout; a thread ends a run that the signal cannot reach.
pytest_plugins = ("timeouts",)

# Ray would otherwise re-run every worker through `uv run` (packaging the repo as a working_dir).
os.environ["RAY_ENABLE_UV_RUN_RUNTIME_ENV"] = "0"


@pytest.fixture(scope="session", autouse=True)
def private_zygotes() -> Iterator[Path]:
    """The suite's own zygote directory (Ray workers inherit it), emptied of zygotes at the end."""
    directory = Path(short_tmp_dir("dlu-z-"))  # short: a socket path
    os.environ["DLU_ZYGOTE_DIR"] = str(directory)
    yield directory
    try:
        from dlu_prime import zygote
    except ImportError:
        remove_made()
        return
    zygote.stop_all(directory)
    remove_made()  # this folder and every other one the tests made with short_tmp_dir


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return REPO_ROOT


@pytest.fixture(scope="session")
def uv_bin() -> str:
    found = os.environ.get("UV") or shutil.which("uv")
    if not found:
        pytest.fail("uv is not on PATH; run the tests with `uv run pytest` as the README says")
    return found


def ray_init_kwargs(tmp_root: str) -> dict[str, object]:
    """Options for a private local Ray beside `init_local`'s (loopback only, no dashboard):
    logical GPUs, and the workers' output forwarded to the tests."""
    return {
        "num_cpus": 8,
        "num_gpus": 8,
        "object_store_memory": 200 * 1024**2,
        "_temp_dir": tmp_root,
        "log_to_driver": True,
    }


@pytest.fixture(scope="session")
def ray_session():  # type: ignore[no-untyped-def]
    """One private Ray instance for the whole test session (starting Ray costs seconds)."""
    import tempfile

    import ray

    tmp_root = tempfile.mkdtemp(prefix="dlu-ray-", dir="/tmp")
    os.environ["RAY_TMPDIR"] = tmp_root
    from dlu_prime.ray_env import init_local

    if ray.is_initialized():
        ray.shutdown()
    # the embedded Ray `dlu run` starts (a lean head whose raylet forks its workers from a Ray
    # zygote: an actor starts in a fraction of a second instead of importing Ray and DLU anew)
    init_local(**ray_init_kwargs(tmp_root))
    yield ray
    ray.shutdown()
    shutil.rmtree(tmp_root, ignore_errors=True)
