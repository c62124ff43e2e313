"""Errors raised by dlu-api. Each names what is wrong and how to fix it."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Problem:
    """One thing wrong with a job spec: the field it is in, what is wrong, and the fix."""

    field: str
    message: str
    fix: str

    def __str__(self) -> str:
        return f"{self.field}: {self.message} Fix: {self.fix}"


class DLUError(Exception):
    """Base class of every error dlu-api raises on purpose."""


class SpecError(DLUError, ValueError):
    """A job spec is invalid; `problems` lists every problem found, not only the first."""

    def __init__(self, problems: Sequence[Problem]) -> None:
        self.problems: list[Problem] = list(problems)
        lines = [f"invalid job spec ({len(self.problems)} problem(s)):"]
        lines += [f"  - {p}" for p in self.problems]
        super().__init__("\n".join(lines))


class MissingComponentError(DLUError, ImportError):
    """A feature needs a package that is not installed; the message says what to install."""


class JobNotFoundError(DLUError, LookupError):
    """No job of that name is known to the client."""


class ClusterError(DLUError):
    """The cluster could not be reached or refused a request."""


class NotSupportedError(DLUError):
    """This client cannot do that (yet); the message says what to use instead."""


class JobRunningError(DLUError):
    """The request needs a job that has stopped (e.g. `dlu delete`); the message says how to stop it."""


class JobNameTakenError(ClusterError):
    """A job of that name is still running where the new one was sent; stop it or rename."""


class SubmittedFromItselfError(JobNameTakenError):
    """A job was submitted from inside one of its own actors or training processes: the module
    an entrypoint names starts the job when it is imported (no `if __name__ == "__main__":`)."""


class ClusterSetupError(ClusterError):
    """The cluster lacks something DLU needs there (Ray's job server, dlu-prime); the message
    says what to install where."""


class VersionMismatchError(ClusterError):
    """The driver's dlu-api and the cluster's dlu-prime are versions that do not work together."""
