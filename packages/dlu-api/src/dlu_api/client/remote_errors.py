"""Plain messages for what goes wrong between a driver and a Ray cluster.

A remote driver sees HTTP answers and, when the launcher fails on the cluster, only the Ray
job's log. These functions turn both into `DLUError`s that say what is wrong and what to do.
"""

from __future__ import annotations

from typing import Any

import httpx

from dlu_api.client import wire
from dlu_api.errors import (
    ClusterError,
    ClusterSetupError,
    DLUError,
    JobNameTakenError,
    Problem,
    SpecError,
    VersionMismatchError,
)

IMAGE_DOC = "docs/kubernetes.md"


def unreachable(address: str, exc: httpx.TransportError) -> ClusterError:
    if isinstance(exc, httpx.TimeoutException):
        why = f"it did not answer in time ({exc.__class__.__name__})"
    else:
        why = f"nothing answers there ({exc.__class__.__name__}: {exc})"
    return ClusterError(
        f"cannot reach the Ray cluster at {address}: {why}. Check the address, that the cluster is up, "
        "and that the head's job server (Ray's dashboard port, 8265 by default) is reachable from here."
    )


def no_job_server(address: str) -> ClusterSetupError:
    return ClusterSetupError(
        f"{address} answers but is not a Ray job server; check the port (the dashboard's, 8265 by "
        "default), and on the cluster install Ray with its default extras (`pip install 'ray[default]'`, "
        "as the rayproject/ray images have) and start the head with the dashboard."
    )


def no_job_agent(address: str, text: str) -> ClusterSetupError:
    return ClusterSetupError(
        f"the Ray head at {address} has a dashboard but no job agent to run jobs ({text.strip()}); "
        "install Ray with its default extras on the head (`pip install 'ray[default]'`) and restart it, "
        "or retry if the head has just started."
    )


def auth_required(address: str, code: int) -> ClusterError:
    what = "needs" if code == 401 else "refused"
    return ClusterError(
        f"the Ray cluster at {address} {what} an auth token ({code}); set RAY_AUTH_TOKEN (or "
        "RAY_AUTH_TOKEN_PATH) to the cluster's token, e.g. the output of `ray get-auth-token` on the head."
    )


def http_error(address: str, response: httpx.Response, what: str) -> ClusterError:
    """Errors common to every request; the caller handles the codes it knows first."""
    text = response.text.strip()
    if response.status_code in (401, 403):
        return auth_required(address, response.status_code)
    if response.status_code in (503, 504) and "agent" in text.lower():
        return no_job_agent(address, text)
    return ClusterError(f"{what} ({response.status_code}): {text}")


def name_taken(name: str, address: str, ray_status: str) -> JobNameTakenError:
    return JobNameTakenError(
        f"a job named {name!r} is still {ray_status} on {address}; pick another name, or stop it "
        f"first with `dlu stop {name} --address {address}`."
    )


def _from_wire(error: dict[str, Any]) -> DLUError:
    kind = str(error.get("kind") or wire.KIND_OTHER)
    message = str(error.get("message") or "the launcher failed")
    if kind == wire.KIND_SPEC and error.get("problems"):
        problems = [
            Problem(str(p.get("field", "?")), str(p.get("message", "")), str(p.get("fix", "")))
            for p in error["problems"]
        ]
        return SpecError(problems)
    if kind == wire.KIND_NAME_TAKEN:
        return JobNameTakenError(message)
    if kind == wire.KIND_VERSION:
        return VersionMismatchError(message)
    return ClusterError(message)


def launch_failure(
    address: str, name: str, log: str | wire.LauncherReport, ray_message: str = ""
) -> DLUError:
    """Why a DLU entrypoint ended on the cluster without doing its work, from its Ray job log."""
    report = wire.parse_log(log) if isinstance(log, str) else log
    if report.error is not None:
        return _from_wire(report.error)
    text = "\n".join(report.other_lines)
    if "No module named dlu_prime" in text or "No module named 'dlu_prime'" in text:
        return ClusterSetupError(
            f"dlu-prime is not installed on the Ray cluster at {address} (its `python` has no dlu_prime). "
            "Install the dlu-prime wheel (plus dlu-elastic for elastic roles, dlu-store-redis for Redis) "
            f"in the cluster's image, the same release as this driver's dlu-api; see {IMAGE_DOC}."
        )
    if "unrecognized arguments" in text or "invalid choice" in text:
        return VersionMismatchError(
            f"the dlu-prime on the Ray cluster at {address} is older than this driver's dlu-api and does "
            "not understand its request; install the same DLU release on the cluster and the driver."
        )
    if "python: command not found" in text or "python: not found" in text:
        return ClusterSetupError(
            f"the Ray cluster at {address} has no `python` on the PATH of its job entrypoints; "
            "use a Ray image (rayproject/ray) or put Python with dlu-prime on that PATH."
        )
    tail = [line for line in report.other_lines if line.strip()][-15:]
    detail = "\n".join(f"  | {line}" for line in tail)
    return ClusterError(
        f"job {name!r} failed on {address} before DLU could run it"
        + (f" ({ray_message})" if ray_message else "")
        + (f"; the end of its log:\n{detail}" if detail else "")
    )
