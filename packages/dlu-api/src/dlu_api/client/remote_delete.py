"""`dlu delete` on a cluster: remove the Ray jobs that ran a DLU job once none of them runs."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import httpx

from dlu_api.client import remote_errors as errors
from dlu_api.errors import JobRunningError

_TERMINAL = ("SUCCEEDED", "FAILED", "STOPPED")


def delete_runs(
    address: str, name: str, runs: list[dict[str, Any]], request: Callable[[str, str], httpx.Response]
) -> None:
    """Delete each run (Ray job) of `name`; refused, deleting none, while one still runs.

    Raises:
        JobRunningError: a run is not finished; the message says how to stop it.
        ClusterError: the job server refused a deletion.
    """
    running = [str(r.get("submission_id")) for r in runs if str(r.get("status")) not in _TERMINAL]
    if running:
        raise JobRunningError(
            f"job {name!r} on {address} is still running (Ray job {running[0]}); stop it "
            f"first with `dlu stop {name} --address {address}`, then delete it"
        )
    for run in runs:
        sid = str(run.get("submission_id"))
        response = request("DELETE", f"/api/jobs/{sid}")
        if response.status_code >= 400 and response.status_code != 404:
            raise errors.http_error(address, response, f"cannot delete Ray job {sid} of job {name!r}")
