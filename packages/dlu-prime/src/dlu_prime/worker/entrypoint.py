"""Loading and running a role's entrypoint inside a worker process."""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import os
import runpy
import sys
import traceback
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any

from dlu_api.spec.entrypoint import Entrypoint, EntrypointKind, parse_entrypoint


class EntrypointError(Exception):
    """The entrypoint cannot be loaded; the message names it and says why."""


class Outcome(StrEnum):
    SUCCESS = "SUCCESS"
    FAILED = "FAILED"


@dataclass(frozen=True)
class Result:
    outcome: Outcome
    error: str | None = None  # the traceback of a failure
    value: Any = None


def resolve_object(entry: Entrypoint) -> Any:
    """Import `module:attr.path`.

    Raises:
        EntrypointError: the module or attribute does not exist or fails to import.
    """
    try:
        module = importlib.import_module(entry.module)
    except ModuleNotFoundError as exc:
        raise EntrypointError(
            f"entrypoint {entry.target!r}: module {exc.name!r} not found (sys.path: {sys.path[:3]}...)"
        ) from exc
    except Exception as exc:
        raise EntrypointError(
            f"entrypoint {entry.target!r}: importing {entry.module!r} failed: {exc!r}\n{traceback.format_exc()}"
        ) from exc
    obj: Any = module
    for part in entry.attr.split("."):
        if not hasattr(obj, part):
            raise EntrypointError(f"entrypoint {entry.target!r}: {entry.module!r} has no attribute {part!r}")
        obj = getattr(obj, part)
    if not callable(obj):
        raise EntrypointError(f"entrypoint {entry.target!r} is not callable")
    return obj


class LoadedEntrypoint:
    """An entrypoint imported during setup, so a bad one fails the self check, not the run."""

    def __init__(self, text: str, workdir: str | None) -> None:
        self.entry = parse_entrypoint(text)
        self.workdir = workdir
        self.instance: Any = None
        self._function: Any = None
        if self.entry.kind is EntrypointKind.OBJECT:
            target = resolve_object(self.entry)
            if inspect.isclass(target):
                self.instance = target()
            else:
                self._function = target
        elif self.entry.kind is EntrypointKind.SCRIPT:
            path = self._script_path()
            if not path.is_file():
                raise EntrypointError(f"entrypoint script {self.entry.target!r} not found at {path}")
        elif self.entry.kind is EntrypointKind.MODULE:
            if importlib.util.find_spec(self.entry.target) is None:
                raise EntrypointError(f"entrypoint module {self.entry.target!r} not found")
        else:
            raise EntrypointError(f"a {self.entry.kind.value} entrypoint needs an elastic role")

    def _script_path(self) -> Path:
        path = Path(self.entry.target)
        if not path.is_absolute() and self.workdir:
            path = Path(self.workdir) / path
        return path

    @property
    def is_service(self) -> bool:
        """A class without run(): it only answers RPCs until the job stops it."""
        return self.instance is not None and not callable(getattr(self.instance, "run", None))

    def run(self) -> Result:
        """Run to completion, turning exceptions and exit codes into a Result."""
        try:
            value = self._run()
        except SystemExit as exc:
            code = exc.code
            if code in (None, 0):
                return Result(Outcome.SUCCESS)
            return Result(Outcome.FAILED, f"exited with code {code!r}\n{traceback.format_exc()}")
        except BaseException:
            return Result(Outcome.FAILED, traceback.format_exc())
        return Result(Outcome.SUCCESS, value=value)

    def _run(self) -> Any:
        kind = self.entry.kind
        if kind is EntrypointKind.OBJECT:
            if self.instance is not None:
                return self.instance.run()
            return self._function()
        argv_saved = sys.argv
        try:
            if kind is EntrypointKind.SCRIPT:
                path = self._script_path()
                sys.argv = [str(path), *self.entry.args]
                runpy.run_path(str(path), run_name="__main__")
            else:
                sys.argv = [self.entry.target, *self.entry.args]
                runpy.run_module(self.entry.target, run_name="__main__", alter_sys=True)
        finally:
            sys.argv = argv_saved
        return None


def prepend_sys_path(workdir: str | None) -> None:
    """Make the submitter's working directory importable, as `python -m` would."""
    if workdir and workdir not in sys.path and os.path.isdir(workdir):
        sys.path.insert(0, workdir)
