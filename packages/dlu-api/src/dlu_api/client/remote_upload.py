"""Uploading a local working directory to a Ray cluster, as `ray job submit --working-dir` does,
with nothing but HTTP: a zip of the directory, named by a hash of its content
(`gcs://_ray_pkg_<hash>.zip`), sent with the Jobs API's package upload unless the cluster has
it already. The job's runtime environment then names that URI as its `working_dir`: Ray
unpacks it on each node and runs the launcher (and the job's actors) there.

Left out: `.git`, `__pycache__`, `.venv` (and other directories named in EXCLUDED_DIRS),
compiled `*.pyc`. A zip over the limit (`DLU_UPLOAD_LIMIT_MB`, default 100) is refused before
anything is sent.
"""

from __future__ import annotations

import hashlib
import io
import os
import zipfile
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx

from dlu_api.client import remote_errors as errors
from dlu_api.errors import Problem, SpecError

EXCLUDED_DIRS = frozenset({".git", "__pycache__", ".venv", ".mypy_cache", ".pytest_cache", ".ruff_cache"})
EXCLUDED_SUFFIXES = (".pyc",)
LIMIT_ENV = "DLU_UPLOAD_LIMIT_MB"
DEFAULT_LIMIT_MB = 100.0
PROTOCOL = "gcs"
_EPOCH = (1980, 1, 1, 0, 0, 0)  # fixed times: the same files always make the same zip


class UploadError(SpecError):
    """The working directory cannot be uploaded (too big, unreadable); nothing was sent."""


def _refusal(message: str, fix: str) -> UploadError:
    return UploadError([Problem("workdir", message, fix)])


def limit_bytes() -> int:
    raw = os.environ.get(LIMIT_ENV, "")
    try:
        value = float(raw) if raw else DEFAULT_LIMIT_MB
    except ValueError:
        value = -1.0
    if value <= 0:
        raise _refusal(
            f"{LIMIT_ENV}={raw!r} is not a size.", f"set {LIMIT_ENV} to a number of MiB > 0, e.g. 200"
        )
    return int(value * 1024 * 1024)


def files(root: Path) -> Iterator[Path]:
    """The files to upload, in a fixed order, excluded directories and symlinked dirs skipped."""
    for current, dirs, names in os.walk(root):
        dirs[:] = sorted(d for d in dirs if d not in EXCLUDED_DIRS and not (Path(current) / d).is_symlink())
        for name in sorted(names):
            path = Path(current) / name
            if not name.endswith(EXCLUDED_SUFFIXES) and path.is_file():
                yield path


def package(root: Path, limit: int | None = None) -> tuple[str, bytes]:
    """(package name `_ray_pkg_<sha1>.zip`, zip bytes) of directory `root`.

    Raises:
        UploadError: not a directory, unreadable, or over the size limit.
    """
    if not root.is_dir():
        raise _refusal(f"{root} is not a directory.", "give --workdir a directory on this machine")
    limit = limit_bytes() if limit is None else limit
    buffer = io.BytesIO()
    total = 0
    with zipfile.ZipFile(buffer, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        for path in files(root):
            try:
                data = path.read_bytes()
                mode = path.stat().st_mode
            except OSError as exc:
                raise _refusal(f"cannot read {path}: {exc}.", "fix its permissions or remove it") from None
            total += len(data)
            if total > limit:
                raise _refusal(
                    f"{root} holds more than the upload limit of {limit / 2**20:.0f} MiB (at {path}).",
                    f"move data out of the directory (or into .git, __pycache__, .venv), or raise {LIMIT_ENV}",
                )
            info = zipfile.ZipInfo(path.relative_to(root).as_posix(), date_time=_EPOCH)
            info.external_attr = (mode & 0o777) << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            archive.writestr(info, data)
    content = buffer.getvalue()
    if len(content) > limit:
        raise _refusal(
            f"the zip of {root} is {len(content) / 2**20:.1f} MiB, over the limit of {limit / 2**20:.0f} MiB.",
            f"move data out of the directory, or raise {LIMIT_ENV}",
        )
    return f"_ray_pkg_{hashlib.sha1(content).hexdigest()}.zip", content


def upload(request: Callable[..., httpx.Response], address: str, root: Path) -> str:
    """Upload `root` unless the cluster has the same package; return its `gcs://` URI.

    The existence check also pins the package for a while (Ray's own client does the same), so
    the cluster does not drop it before the job that names it is submitted.

    Raises:
        UploadError: see `package`.
        ClusterError: the cluster refused the upload.
    """
    name, content = package(root)
    path = f"/api/packages/{PROTOCOL}/{name}"
    found = request("GET", path)
    if found.status_code == 404:
        sent = request("PUT", path, content=content)
        if sent.status_code >= 400:
            raise errors.http_error(address, sent, f"the cluster refused the upload of {root}")
    elif found.status_code >= 400:
        raise errors.http_error(address, found, f"cannot check whether the cluster has {root}")
    return f"{PROTOCOL}://{name}"
