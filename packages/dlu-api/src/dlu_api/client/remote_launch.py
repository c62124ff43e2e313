"""What a remote run is submitted as: the launcher's entrypoint with the spec inline, a fresh
Ray submission id, the `--workdir` split into upload or cluster path, and the Ray auth token.

Pure helpers of `dlu_api.client.remote.RemoteJobClient` (which re-exports them), no HTTP.
"""

from __future__ import annotations

import json
import os
import shlex
import uuid
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

from dlu_api.client import wire
from dlu_api.spec.models import JobSpec

SUBMISSION_PREFIX = "dlu-"
PRIME_COMMAND = "python -m dlu_prime"
LAUNCH_COMMAND = f"{PRIME_COMMAND} launch"
TOKEN_ENV = "RAY_AUTH_TOKEN"
TOKEN_PATH_ENV = "RAY_AUTH_TOKEN_PATH"
CLUSTER_PATH_PREFIX = "cluster:"  # --workdir cluster:/path: a directory on the nodes, never uploaded


def dlu_api_version() -> str:
    try:
        return version("dlu-api")
    except PackageNotFoundError:
        return "0+unknown"


def new_submission_id(name: str) -> str:
    """A fresh Ray job id per run: Ray keeps a finished job's record and log under its id, so
    reusing one would mix an old run's log into the new one. The job is found by its metadata."""
    return f"{SUBMISSION_PREFIX}{name}-{uuid.uuid4().hex[:8]}"


def _prime_args(command: str) -> str:
    return f"{PRIME_COMMAND} {command} {wire.API_VERSION_FLAG} {shlex.quote(dlu_api_version())}"


def launch_entrypoint(spec: JobSpec, resume: bool = False, workdir: str | None = None) -> str:
    """The shell command the cluster runs: the dlu-prime launcher with the spec inline."""
    parts = [_prime_args("launch")]
    if workdir:
        parts.append(f"--workdir {shlex.quote(workdir)}")
    if resume:
        parts.append("--resume")
    parts.append(f"--spec-json {shlex.quote(spec.model_dump_json())}")
    return " ".join(parts)


def spec_from_entrypoint(entrypoint: str) -> dict[str, Any] | None:
    """The spec inside a launcher entrypoint; None if it holds none."""
    try:
        argv = shlex.split(entrypoint)
        value: dict[str, Any] = json.loads(argv[argv.index("--spec-json") + 1])
    except (ValueError, IndexError):
        return None
    return value


def working_dir(workdir: str | None) -> tuple[str | None, str | None]:
    """(directory on the cluster's nodes for the launcher, `working_dir` for Ray's runtime env)
    of a `--workdir` value: a directory on this machine is uploaded (its path is returned in
    the second place, to be uploaded); `cluster:/path`, or a path this machine does not have,
    names a directory on the nodes; a URI (`s3://...`, `gcs://...`) is Ray's to fetch."""
    if not workdir:
        return None, None
    if workdir.startswith(CLUSTER_PATH_PREFIX):
        return workdir.removeprefix(CLUSTER_PATH_PREFIX), None
    if "://" in workdir or Path(workdir).expanduser().is_dir():
        return None, workdir
    return workdir, None


def find_token(explicit: str | None = None) -> str | None:
    """The Ray auth token to send: given, `$RAY_AUTH_TOKEN`, `$RAY_AUTH_TOKEN_PATH`'s file, or the
    file Ray itself uses (`~/.ray/auth_token`); None if there is none."""
    if explicit:
        return explicit
    if os.environ.get(TOKEN_ENV):
        return os.environ[TOKEN_ENV].strip()
    candidates = [os.environ.get(TOKEN_PATH_ENV), str(Path.home() / ".ray" / "auth_token")]
    for candidate in candidates:
        if candidate and Path(candidate).is_file():
            token = Path(candidate).read_text(encoding="utf-8").strip()
            if token:
                return token
    return None
