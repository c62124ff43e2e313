"""Folders with short paths under /tmp for the tests' own Rays and zygotes (a Unix socket path
must stay under 108 bytes, too short for pytest's tmp_path), removed when the session ends so
CI machines do not gather them."""

from __future__ import annotations

import shutil
import tempfile

_MADE: list[str] = []


def short_tmp_dir(prefix: str) -> str:
    """A new empty folder /tmp/PREFIXxxxxxxxx, removed by `remove_made` at the session's end."""
    path = tempfile.mkdtemp(prefix=prefix, dir="/tmp")
    _MADE.append(path)
    return path


def remove_made() -> None:
    """Remove every folder `short_tmp_dir` made in this process (whatever a Ray left in it)."""
    while _MADE:
        shutil.rmtree(_MADE.pop(), ignore_errors=True)
