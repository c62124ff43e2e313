"""Requests to a running remote job through its mailbox (see `dlu_api.client.wire`): upload the
request with the Jobs API's package upload, then read the launcher's log for its answer. No
Ray job is started, so nothing is left in Ray's job list."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable
from typing import Any

import httpx

from dlu_api.client import remote_errors as errors
from dlu_api.client import wire
from dlu_api.client.launcher_feed import LauncherFeed
from dlu_api.errors import ClusterError, ClusterSetupError, JobNotFoundError

Request = Callable[..., httpx.Response]
_TERMINAL = ("SUCCEEDED", "FAILED", "STOPPED")
_INFO_EVERY_S = 1.0  # how often the Ray job's state is checked while waiting for an answer


def check_supported(address: str, accepted: dict[str, Any]) -> None:
    """Refuse a launcher that reads no mailbox (an older dlu-prime, or a Ray that changed)."""
    if not accepted.get(wire.MAILBOX):
        raise ClusterSetupError(
            f"the job's launcher on {address} (dlu-prime {accepted.get('dlu_prime', '?')}) does not read "
            "requests from remote drivers; upgrade dlu-prime on the cluster to this dlu-api's version"
        )


def find_answer(log_text: str, request_id: str) -> dict[str, Any] | None:
    """The launcher's answer to `request_id` in its log, if it has written it."""
    marker = f'"id":"{request_id}"'
    for raw in log_text.splitlines():
        if raw.startswith(wire.ANSWER + " ") and marker in raw:
            return wire.parse_log([raw]).answers.get(request_id)
    return None


def ask(
    request: Request,
    address: str,
    name: str,
    sid: str,
    body: dict[str, Any],
    timeout_s: float,
    poll_s: float = 0.1,
    feed: LauncherFeed | None = None,
) -> dict[str, Any]:
    """Leave `body` for job `name` (Ray job `sid`) and wait for the answer:
    {"result": ...} or {"error": "..."}. `feed`: the launcher's log followed from before the
    request was left (only what it appends is read); without one, the whole log is read again
    every `poll_s` (a cluster without Ray's log API).

    Raises:
        JobNotFoundError: the job ended before it answered.
        ClusterError: the request could not be left, or no answer came within `timeout_s`.
    """
    request_id = uuid.uuid4().hex[:16]
    path = f"/api/packages/{wire.MAIL_PROTOCOL}/{wire.mail_package(name, request_id)}"
    response = request("PUT", path, content=json.dumps(body).encode())
    if response.status_code >= 400:
        raise errors.http_error(address, response, f"cannot leave a request for job {name!r}")
    deadline = time.monotonic() + timeout_s
    next_info = time.monotonic() + _INFO_EVERY_S
    while True:
        if feed is not None:
            report = feed.wait_for(lambda r: request_id in r.answers, _INFO_EVERY_S)
            answer = None if report is None else report.answers[request_id]
        else:
            response = request("GET", f"/api/jobs/{sid}/logs")
            if response.status_code >= 400:
                raise errors.http_error(address, response, f"cannot read the log of job {name!r}")
            answer = find_answer(str(response.json().get("logs", "")), request_id)
        if answer is not None:
            return answer
        now = time.monotonic()
        if now >= next_info:
            next_info = now + _INFO_EVERY_S
            info = request("GET", f"/api/jobs/{sid}")
            if info.status_code < 400 and str(info.json().get("status")) in _TERMINAL:
                raise JobNotFoundError(f"job {name!r} on {address} stopped before it answered")
        if now > deadline:
            raise ClusterError(
                f"job {name!r} on {address} did not answer {body.get('action')!r} within {timeout_s:.0f} s; "
                f"is its launcher busy? `dlu events -f {name}` shows what it is doing"
            )
        if feed is None:
            time.sleep(poll_s)
