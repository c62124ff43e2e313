"""`Job`: a validated spec plus the calls users make on it."""

from __future__ import annotations

import os
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from dlu_api.client import JobClient, StatusCallback, connect
from dlu_api.client.local import VERBOSE_ENV
from dlu_api.spec.io import load_spec
from dlu_api.spec.models import JobSpec
from dlu_api.spec.rules import ensure_valid
from dlu_api.status import JobStatus


@dataclass
class JobHandle:
    """A submitted job."""

    name: str
    client: JobClient

    def wait(self, on_update: StatusCallback | None = None) -> JobStatus:
        return self.client.wait(self.name, on_update)

    def status(self) -> JobStatus:
        return self.client.status(self.name)

    def stop(self) -> None:
        self.client.stop(self.name)

    def scale(self, role: str, size: int) -> dict[str, object]:
        """Set a simple role's actor count, or an elastic role's node count (within its nnodes
        MIN..MAX), while the job runs (see `JobClient.scale`)."""
        return self.client.scale(self.name, role, size)

    def logs(self, follow: bool = False, role: str | None = None, rank: int | None = None) -> Iterator[str]:
        """What the ranks printed (see `JobClient.logs`)."""
        return self.client.logs(self.name, follow, role=role, rank=rank)


class Job:
    """A job ready to run. Construction validates the spec, so a bad spec never starts anything.

    Raises:
        SpecError: from the constructor, listing every problem.
    """

    def __init__(self, spec: JobSpec) -> None:
        self.spec = ensure_valid(spec)

    @classmethod
    def from_file(cls, path: str | Path) -> Job:
        return cls(load_spec(path))

    def submit(
        self, address: str | None = None, workdir: str | None = None, verbose: bool = False
    ) -> JobHandle:
        """Start the job locally (no address) or on the cluster at `address`; do not wait.

        `workdir`: on a cluster, the job's code: a directory here (uploaded), `cluster:/path` on
        its nodes, or a URI Ray fetches (see `dlu_api.client.remote_launch.working_dir`).
        `verbose` (or `$DLU_VERBOSE`): a local run shows Ray's own warnings and logs and its
        actors' output, as `dlu run --verbose`; without it, as quiet as `dlu run`.

        Raises:
            SpecError: the spec breaks a rule here, or the cluster found it cannot run there.
            ClusterError: unreachable cluster, no job server, name taken, dlu-prime missing on
                the cluster, or a dlu-api / dlu-prime version mismatch (each a subclass).
        """
        verbose = verbose or os.environ.get(VERBOSE_ENV, "").lower() in ("1", "true", "yes")
        if not verbose:
            warnings.filterwarnings("ignore", module=r"ray(\.|$)")
        client = connect(address, workdir, quiet=not verbose)
        return JobHandle(client.submit(self.spec), client)

    def scale(self, role: str, size: int, address: str | None = None) -> dict[str, object]:
        """Set a simple role's actor count, or an elastic role's node count (within its nnodes
        MIN..MAX), while this job runs, locally or at `address`."""
        return connect(address).scale(self.spec.name, role, size)

    def run(
        self, address: str | None = None, on_update: StatusCallback | None = None, verbose: bool = False
    ) -> JobStatus:
        """Start the job and wait for it to stop; the status carries the exit code.

        Ctrl-C (KeyboardInterrupt) stops the job cleanly, as in `dlu run`, then is raised again;
        a second one stops it at once. A local job is thus recorded STOPPED, not LOST."""
        handle = self.submit(address, verbose=verbose)
        try:
            return handle.wait(on_update)
        except KeyboardInterrupt:
            try:
                handle.stop()
                handle.wait()
            except KeyboardInterrupt:
                handle.client.stop_now(handle.name, "interrupted twice: stopped at once")
            raise
