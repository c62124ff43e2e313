"""A remote job's status and exit code, from its Ray job record and its launcher's log.

Pure functions of what the Jobs API returned, so `dlu status` and `dlu list` apply one rule:
the exit code of a finished job is the one its launcher reported in its final `DLU-STATUS`;
the launcher exits with that same code, so where the log is not read (`dlu list`) Ray's
`driver_exit_code` gives it. Only a launcher that never reported (killed, or refused the job)
falls back on Ray's verdict: 0 for SUCCEEDED, 1 otherwise.
"""

from __future__ import annotations

from typing import Any

from dlu_api.client import remote_errors as errors
from dlu_api.client import wire
from dlu_api.status import JobStage, JobStatus, JobSummary

TERMINAL = ("SUCCEEDED", "FAILED", "STOPPED")
_RAY_TO_STAGE = {
    "PENDING": JobStage.PENDING,
    "RUNNING": JobStage.RUNNING,
    "STOPPED": JobStage.STOPPED,
    "SUCCEEDED": JobStage.STOPPED,
    "FAILED": JobStage.STOPPED,
}


def exit_code(info: dict[str, Any], final: JobStatus | None = None) -> int | None:
    """The exit code of the Ray job `info` runs (None while it runs); `final`: the launcher's
    final status, where the log was read."""
    ray_status = str(info.get("status"))
    if ray_status not in TERMINAL:
        return None
    if final is not None and final.finished and final.exit_code is not None:
        return final.exit_code
    driver_code = info.get("driver_exit_code")
    if isinstance(driver_code, int) and ray_status != "STOPPED":
        return driver_code
    return 0 if ray_status == "SUCCEEDED" else 1


def summary(info: dict[str, Any], name: str, address: str) -> JobSummary:
    """`dlu list`'s line for one run, from the job list alone."""
    stage = _RAY_TO_STAGE.get(str(info.get("status")), JobStage.PENDING)
    return JobSummary(name=name, stage=stage, exit_code=exit_code(info), where=address)


def status_from(name: str, address: str, info: dict[str, Any], log: str | wire.LauncherReport) -> JobStatus:
    """The job's status: what its launcher last published (in its log, whole text or as parsed
    by a `LauncherFeed`), or why it has none."""
    ray_status = str(info.get("status", "PENDING"))
    report = wire.parse_log(log) if isinstance(log, str) else log
    current = report.current
    message = str(info.get("message") or "")
    if ray_status in TERMINAL:
        if current is not None and current.finished:
            return current.model_copy(update={"exit_code": exit_code(info, current)})
        code = exit_code(info)
        if report.accepted is None:
            reason = str(errors.launch_failure(address, name, report, message))
            return JobStatus(name=name, stage=JobStage.STOPPED, exit_code=code, reason=reason)
        base = current or JobStatus(name=name, stage=JobStage.STOPPED)
        reason = f"its launcher ended ({ray_status}): {message}".rstrip(": ")
        return base.model_copy(update={"stage": JobStage.STOPPED, "exit_code": code, "reason": reason})
    if report.accepted is None:
        return JobStatus(
            name=name, stage=JobStage.PENDING, reason=f"Ray job {ray_status}: the launcher is starting"
        )
    return current or JobStatus(name=name, stage=JobStage.INIT)
